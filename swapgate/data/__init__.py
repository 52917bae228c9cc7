"""Plain data the rest shares: warm states, the frozen snapshots placement reads, demand
(arrivals), leases and counts. No I/O, no loops."""
