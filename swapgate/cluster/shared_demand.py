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
import logging
import time

from swapgate.cluster.store import Cluster
from swapgate.control.forecast import DayDemand, fold

log = logging.getLogger("swapgate.forecast")
SYNC = 60.0


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
        if arrivals and not await self._cluster.add_arrivals(arrivals):
            self._demand.give_back(arrivals)
            return
        learned = await self._cluster.learned()
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
            arrivals = await self._cluster.day_arrivals(day)
            if arrivals is None:
                return learned  # Redis went: fold next time
            current = fold({**current, "day": day}, arrivals)
        if current is not learned and not await self._cluster.learn(current):
            return learned
        return current
