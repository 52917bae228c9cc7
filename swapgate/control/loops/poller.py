"""Reconciles warm state and health from every instance each ``routing.poll_interval``, and at
once whenever an instance announces a change (llama-server's router).

An instance is declared down after ``DOWN_AFTER`` failed polls in a row, each bounded by the
drivers' poll timeout (5 s). The second is not left to the next interval: a failed poll, or a
request whose connection to the instance failed (``PollResults.suspect``), has it asked again
``CONFIRM_AFTER`` later. A hung instance is so declared down within an interval and two poll
timeouts (at most 11 s with the default 5 s interval) instead of two intervals and two timeouts
(20 s), and a dead one at the first request it refuses (docs/operations.md, "When part of the
fleet breaks"). Polling more often would cost every instance a request each time; this costs
one only where something failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from swapgate.control.state.registry import Registry
from swapgate.data.warm import InstanceReport
from swapgate.errors import DriverError, DriverTimeout
from swapgate.metrics import Metrics

log = logging.getLogger("swapgate.poller")
# One failed poll is forgiven (a busy server may miss one); this many in a row take it down.
DOWN_AFTER = 2
CONFIRM_AFTER = 1.0  # seconds from a failure that makes an instance suspect to its next poll


class Reports(Protocol):
    """What the poller asks of a driver."""

    polls_while_busy: bool

    async def state(self) -> InstanceReport: ...
    def changes(self) -> AsyncIterator[None]: ...


class Poller:
    def __init__(
        self,
        registry: Registry,
        drivers: Mapping[str, Reports],
        metrics: Metrics,
        interval: float,
        reconcile: Callable[[str], object] = lambda name: None,
    ) -> None:
        self._registry = registry
        self._clock = registry.clock
        self._drivers = drivers
        self._metrics = metrics
        self._interval = interval
        # Told after each report applied: puts back what is awake beyond capacity
        # (``SwapCoordinator.reconcile``, swapgate/control/swaps/coordinator.py).
        self._reconcile = reconcile
        self._failures: dict[str, int] = {}  # failed polls in a row, per instance

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(name) for name in self._drivers))

    async def poll(self, name: str) -> None:
        was_up = self._registry.is_up(name)
        generation = self._registry.generation(name)
        asked = self._clock()
        driver = self._drivers[name]
        if not driver.polls_while_busy and self._registry.serving(name):
            # Its requests in flight show it up or fail; a poll would cut them (drivers/base.py,
            # ``polls_while_busy``).
            return
        try:
            report = await driver.state()
        except DriverTimeout as exc:
            if self._registry.progressing(name, asked):
                # Busy, not down: a server that generates may answer no poll meanwhile.
                self._metrics.upstream_errors.labels(name, "poll_busy").inc()
                log.info("instance %s answered no poll while its answers stream: busy", name)
                return
            self._failed(name, was_up, exc)
            return
        except DriverError as exc:
            self._failed(name, was_up, exc)
            return
        self._failures.pop(name, None)
        self._registry.polls.apply_report(name, report, generation)
        if not was_up:
            log.info("instance %s is up", name)
        self._reconcile(name)

    def _failed(self, name: str, was_up: bool, exc: DriverError) -> None:
        self._metrics.upstream_errors.labels(name, "poll").inc()
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        if was_up and failures >= DOWN_AFTER:
            self._registry.polls.mark_down(name)
            log.warning("instance %s is down: %s", name, exc)
        elif was_up:
            self._registry.polls.suspect(name)  # asked again soon, not at the next interval
        elif not was_up:
            log.debug("instance %s still down: %s", name, exc)

    async def run(self) -> None:
        """Poll every ``interval``, and each instance again whenever it announces a change."""
        async with asyncio.TaskGroup() as group:
            for name in self._drivers:
                group.create_task(self._follow(name), name=f"follow {name}")
                group.create_task(self._confirm(name), name=f"confirm {name}")
            while True:
                await asyncio.sleep(self._interval)
                await self.poll_all()

    async def _confirm(self, name: str) -> None:
        """Poll ``name`` again ``CONFIRM_AFTER`` after each failure that made it suspect."""
        while True:
            await self._registry.polls.suspected(name)
            await asyncio.sleep(CONFIRM_AFTER)
            await self.poll(name)

    async def _follow(self, name: str) -> None:
        async for _ in self._drivers[name].changes():
            await self.poll(name)
