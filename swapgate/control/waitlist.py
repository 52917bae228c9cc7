"""The requests for each model: every arrival (its demand, which placement and the forecast
read) and those waiting now, oldest first."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from swapgate.model.demand import Arrivals


class Waitlist:
    def __init__(
        self, clock: Callable[[], float], on_arrival: Callable[[str], None] | None = None
    ) -> None:
        """``on_arrival`` is told of every arrival: the demand by time of day
        (swapgate/control/forecast.py)."""
        self._clock = clock
        self._on_arrival = on_arrival
        # model -> when each queued request arrived, oldest first: snapshots read the first
        self._queued: dict[str, list[float]] = {}
        self._arrivals: dict[str, Arrivals] = {}

    def arrived(self, model: str) -> None:
        """Count a request for ``model`` in its gateway-wide arrivals, however it is served."""
        now = self._clock()
        seen = self._arrivals.get(model)
        self._arrivals[model] = seen.counted(now) if seen else Arrivals(now)
        if self._on_arrival is not None:
            self._on_arrival(model)

    @contextmanager
    def queued(self, model: str, since: float) -> Iterator[int]:
        """Count a request for ``model`` that arrived at ``since`` as queued while it waits;
        gives the queue's depth with it."""
        depth = self.enter(model, since)
        try:
            yield depth
        finally:
            self.leave(model, since)

    def enter(self, model: str, since: float) -> int:
        """Queue a request for ``model`` that arrived at ``since``; returns the queue's depth."""
        queue = self._queued.setdefault(model, [])
        bisect.insort(queue, since)  # requests queue as they arrive: an append, nearly always
        return len(queue)

    def leave(self, model: str, since: float) -> None:
        queue = self._queued[model]
        queue.remove(since)
        if not queue:  # only models with requests queued stay: snapshots iterate them
            del self._queued[model]

    def depths(self) -> dict[str, int]:
        return {model: len(since) for model, since in self._queued.items()}

    def oldest(self) -> dict[str, float]:
        """For each model with requests queued, when the oldest one arrived."""
        return {model: since[0] for model, since in self._queued.items()}

    def arrivals(self) -> dict[str, Arrivals]:
        return dict(self._arrivals)
