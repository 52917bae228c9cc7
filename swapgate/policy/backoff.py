"""How long an instance whose swap failed stays out of placement (docs/architecture.md): 5 s after
one failure, doubling with each failure in a row, at most 5 minutes; a swap that works resets it."""

from __future__ import annotations

FIRST = 5.0
MOST = 300.0


class Backoff:
    def __init__(self, first: float = FIRST, most: float = MOST) -> None:
        self._first = first
        self._most = most
        self._steps: dict[str, float] = {}

    def failed(self, instance: str) -> float:
        """Seconds ``instance`` is left alone after this failure."""
        step = min(max(self._steps.get(instance, 0.0) * 2, self._first), self._most)
        self._steps[instance] = step
        return step

    def succeeded(self, instance: str) -> None:
        self._steps.pop(instance, None)
