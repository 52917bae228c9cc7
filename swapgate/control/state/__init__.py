"""The live state: the registry, the per-instance slots and queues it owns, and the parts through
which each caller changes it (polls, swap marks, traffic, operator marks)."""
