"""The requests for each model: every arrival (its demand, which placement and the forecast
read) and those waiting now, by priority class, then arrival (docs/keys.md)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from swapgate.data.demand import Arrivals

Pool = tuple[str, ...]  # the instances a request may use, sorted; () for any


class Queues:
    def __init__(
        self, clock: Callable[[], float], on_arrival: Callable[[str], None] | None = None
    ) -> None:
        """``on_arrival`` is told of every arrival: the demand by time of day
        (swapgate/control/loops/forecast.py)."""
        self._clock = clock
        self._on_arrival = on_arrival
        # model -> (-class, when it arrived, its pool's instances: () for any) of each queued
        # request, first served first
        self._queued: dict[str, list[tuple[int, float, Pool]]] = {}
        self._arrivals: dict[str, Arrivals] = {}

    def arrived(self, model: str) -> None:
        """Count a request for ``model`` in its gateway-wide arrivals, however it is served."""
        now = self._clock()
        seen = self._arrivals.get(model)
        self._arrivals[model] = seen.counted(now) if seen else Arrivals(now)
        if self._on_arrival is not None:
            self._on_arrival(model)

    @contextmanager
    def queued(self, model: str, since: float, priority: int = 0, pool: Pool = ()) -> Iterator[int]:
        """Count a request for ``model`` of class ``priority`` that arrived at ``since`` (and
        may use only ``pool``'s instances, if any) as queued while it waits; gives the queue's
        depth with it."""
        depth = self.enter(model, since, priority, pool)
        try:
            yield depth
        finally:
            self.leave(model, since, priority, pool)

    def enter(self, model: str, since: float, priority: int = 0, pool: Pool = ()) -> int:
        """Queue a request for ``model`` that arrived at ``since``; returns the queue's depth."""
        queue = self._queued.setdefault(model, [])
        bisect.insort(queue, (-priority, since, pool))  # nearly always an append
        return len(queue)

    def leave(self, model: str, since: float, priority: int = 0, pool: Pool = ()) -> None:
        queue = self._queued[model]
        queue.remove((-priority, since, pool))
        if not queue:  # only models with requests queued stay: snapshots iterate them
            del self._queued[model]

    def ahead(self, model: str, priority: int, since: float, pool: Pool = ()) -> int:
        """How many queued requests for ``model`` go before one of class ``priority`` that
        arrived at ``since``: a higher class, or the same class earlier; of those with a pool,
        only those whose instances ``pool``'s meet (the others take no slot it could use)."""
        queue = self._queued.get(model, [])
        before = bisect.bisect_left(queue, (-priority, since))
        if not pool:
            return before
        mine = set(pool)
        return sum(1 for _, _, theirs in queue[:before] if not theirs or mine.intersection(theirs))

    def depths(self) -> dict[str, int]:
        return {model: len(queue) for model, queue in self._queued.items()}

    def oldest(self) -> dict[str, float]:
        """For each model with requests queued, when the oldest one arrived."""
        return {model: min(e[1] for e in queue) for model, queue in self._queued.items()}

    def classes(self) -> dict[str, int]:
        """For each model with requests queued, the highest class among them."""
        return {model: -queue[0][0] for model, queue in self._queued.items()}

    def arrivals(self) -> dict[str, Arrivals]:
        return dict(self._arrivals)
