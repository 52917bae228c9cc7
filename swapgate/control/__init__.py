"""The live state and the loops that change it: the registry, swaps, routing and waiting,
polling, preloads, the scheduler, failover and the demand forecast."""
