"""The demand by time of day among replicas (docs/deploy.md, issue 23): learned from all of them.

Every ``SYNC`` each replica adds the arrivals it counted to the day's shared counts in Redis;
the replica holding the scheduler's lease then folds the days that ended into the one usual
day kept there (``forecast.fold``) and every replica takes that day back, so the auto preloads
of whichever replica leads see every replica's traffic, and a replica that starts (a pod
restarted, with no state directory of its own) knows what was learned before it. Redis down:
the arrivals wait and are added when it answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from swapgate.cluster.store import PREFIX, Cluster
from swapgate.control.loops.forecast import SLOTS, DayDemand, fold

log = logging.getLogger("swapgate.forecast")
SYNC = 60.0
DAY_COUNTS_TTL = 8 * 86400  # a day's shared arrivals, kept until long after they are folded in


class SharedDemand:
    def __init__(self, demand: DayDemand, cluster: Cluster) -> None:
        self._demand, self._cluster = demand, cluster
        demand.shared = True

    async def run(self) -> None:
        """Sync every ``SYNC`` (the first one is the runtime's, at start)."""
        while True:
            await asyncio.sleep(SYNC)
            await self.sync()

    async def sync(self) -> None:
        """Share this replica's arrivals; fold ended days if it leads; take the usual day."""
        arrivals = self._demand.take_arrivals()
        if arrivals and not await self._add_arrivals(arrivals):
            self._demand.give_back(arrivals)
            return
        learned = await self._learned()
        if await self._cluster.leads():
            learned = await self._folded(learned)
        if learned is not None:
            self._demand.adopt(learned)

    async def _folded(self, learned: dict[str, object] | None) -> dict[str, object] | None:
        today = int(time.time() // 86400)
        current: dict[str, object] = learned or {"day": today - 1, "models": {}}
        start = current["day"]
        assert isinstance(start, int)
        for day in range(max(start, today - 7), today):  # a week away: older counts are gone
            arrivals = await self._day_arrivals(day)
            if arrivals is None:
                return learned  # Redis went: fold next time
            current = fold({**current, "day": day}, arrivals)
        if current is not learned and not await self._learn(current):
            return learned
        return current

    # -- in Redis: each day's counts (a hash per day), the usual day (one JSON value) ------------

    async def _add_arrivals(self, arrivals: Mapping[str, int]) -> bool:
        """Add ``day:model:slot`` counts to each day's shared counts; False if Redis did not."""
        pipe = self._cluster.redis.pipeline(transaction=False)
        for key, count in arrivals.items():
            day, field = key.split(":", 1)
            pipe.hincrby(f"{PREFIX}demand:{day}", field, count)
            pipe.expire(f"{PREFIX}demand:{day}", DAY_COUNTS_TTL)
        return await self._cluster.call(pipe.execute()) is not None

    async def _day_arrivals(self, day: int) -> dict[str, list[int]] | None:
        """Every replica's arrivals on ``day``, per model and slot; None if Redis gave none."""
        found = await self._cluster.call(self._cluster.redis.hgetall(f"{PREFIX}demand:{day}"))
        if not isinstance(found, dict):
            return None
        counts: dict[str, list[int]] = {}
        for field, count in found.items():
            model, _, slot = str(field).rpartition(":")
            if model and slot.isdigit() and int(slot) < SLOTS:
                counts.setdefault(model, [0] * SLOTS)[int(slot)] += int(count)
        return counts

    async def _learned(self) -> dict[str, Any] | None:
        """The usual day learned from every replica's arrivals (``forecast.fold``)."""
        raw = await self._cluster.call(self._cluster.redis.get(PREFIX + "demand"))
        try:
            data = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            return None
        return data if isinstance(data, dict) and isinstance(data.get("day"), int) else None

    async def _learn(self, learned: Mapping[str, Any]) -> bool:
        stored = self._cluster.redis.set(PREFIX + "demand", json.dumps(learned))
        return await self._cluster.call(stored) is not None
