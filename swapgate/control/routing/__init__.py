"""A request's way to an upstream: the router's lease, the waiter that places it again at every
change, its tries after a failure, and what its client and key may have open."""
