"""Replicas sharing one fleet through Redis: the store (locks, events, the scheduler lease), the
shared swap coordinator and the shared demand."""
