"""In-process parts for unit tests: a driver that records calls, and a gateway's live state
(registry, swap coordinator, router, preloader) wired from a config, with no network."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.config.settings import Settings
from swapgate.control.preload import Preloader
from swapgate.control.registry import Registry
from swapgate.control.router import Router, policy_for
from swapgate.control.swaps import SwapCoordinator, SwapTimes
from swapgate.drivers.base import Driver
from swapgate.errors import DriverError
from swapgate.metrics import Metrics
from swapgate.model.state import InstanceReport, WarmState


class FakeDriver(Driver):
    """Records calls; loads take ``delay`` seconds and fail while ``fail`` is set."""

    def __init__(self, delay: float = 0.05, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.calls: list[tuple[str, str]] = []

    async def state(self) -> InstanceReport:
        return InstanceReport({}, None)

    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.calls.append(("cancelled", model))
            raise
        if self.fail:
            raise DriverError("boom")

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", model))


@dataclass
class World:
    settings: Settings
    registry: Registry
    coordinator: SwapCoordinator
    router: Router
    preloader: Preloader
    drivers: dict[str, FakeDriver]
    metrics: Metrics

    def warm(self, instance: str, *models: str) -> None:
        """A poll says ``instance`` is up with ``models`` warm."""
        report = InstanceReport(dict.fromkeys(models, WarmState.WARM), None)
        self.registry.apply_report(instance, report, self.registry.generation(instance))

    def state(self, instance: str, model: str) -> WarmState:
        return self.registry.snapshot().instance(instance).state_of(model)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def world(config: dict[str, Any], delay: float = 0.05) -> World:
    settings = parse_config(config)
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog)
    drivers = {inst.name: FakeDriver(delay) for inst in settings.instances}
    metrics = Metrics()
    times = SwapTimes(settings.routing.expected_swap)
    coordinator = SwapCoordinator(
        registry, dict(drivers), catalog, times, metrics, settings.routing.swap_timeout
    )
    router = Router(settings, registry, coordinator, catalog, metrics)
    preloader = Preloader(
        registry, coordinator, policy_for(settings, coordinator), settings.routing.swap_timeout
    )
    return World(settings, registry, coordinator, router, preloader, drivers, metrics)
