"""Reconciles warm state and health from every instance each ``routing.poll_interval``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from swapgate.drivers import Driver
from swapgate.errors import DriverError
from swapgate.metrics import Metrics
from swapgate.registry import Registry

log = logging.getLogger("swapgate.poller")


class Poller:
    def __init__(
        self, registry: Registry, drivers: Mapping[str, Driver], metrics: Metrics, interval: float
    ) -> None:
        self._registry = registry
        self._drivers = drivers
        self._metrics = metrics
        self._interval = interval

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(name) for name in self._drivers))

    async def poll(self, name: str) -> None:
        was_up = self._registry.is_up(name)
        generation = self._registry.generation(name)
        try:
            report = await self._drivers[name].state()
        except DriverError as exc:
            self._metrics.upstream_errors.labels(name, "poll").inc()
            self._registry.poll_failed(name)
            if was_up and not self._registry.is_up(name):
                log.warning("instance %s is down: %s", name, exc)
            elif not was_up:
                log.debug("instance %s still down: %s", name, exc)
            return
        self._registry.apply_report(name, report, generation)
        if not was_up:
            log.info("instance %s is up", name)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.poll_all()
