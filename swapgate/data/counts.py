"""Events counted by the second over a sliding window: bounded whatever their rate (a key's
requests in the last minute, an engine's requests per second)."""

from __future__ import annotations

from collections import deque


class PerSecond:
    def __init__(self) -> None:
        self._buckets: deque[list[int]] = deque()  # [second, events], oldest first

    def add(self, now: float, window: float) -> None:
        """Count one event at ``now``; forget the seconds older than ``window``."""
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += 1
        else:
            self._buckets.append([second, 1])
        while self._buckets and self._buckets[0][0] <= now - window:
            self._buckets.popleft()

    def count(self, now: float, window: float) -> int:
        """The events of the seconds within ``window`` of ``now``."""
        return sum(events for second, events in self._buckets if second > now - window)
