"""The Runtime owns every live object of a running gateway, reloads them, and closes them in order.

Two kinds of parts: the live ones a reload keeps (the registry's warm state, swap history and
in-flight counts, the HTTP clients, the scheduler with its job history), and the ``Configured``
ones it replaces, built from one config and swapped in by one assignment, so nothing ever runs
with half of an old config. Whatever outlives a reload (the scheduler, the endpoint) reads the
configured parts through the runtime at the moment it uses them, never a copy of its own.

Built from validated settings without I/O; ``start`` connects and schedules, ``reload`` swaps in
a new config while instances that stay keep their warm state, ``aclose`` tears down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from swapgate.auth import AdminAuth, ClientAuth
from swapgate.cluster.shared import SharedSwaps
from swapgate.cluster.shared_demand import SharedDemand
from swapgate.cluster.store import Cluster
from swapgate.config.catalog import Catalog
from swapgate.config.loading import load_config
from swapgate.config.paths import processes_directory
from swapgate.config.settings import ConfigError, Settings, secret
from swapgate.control.forecast import DayDemand, state_file
from swapgate.control.poller import Poller
from swapgate.control.preload import Preloader
from swapgate.control.registry import Registry
from swapgate.control.router import Router, policy_for
from swapgate.control.scheduler import PreloadScheduler
from swapgate.control.swaps import SwapCoordinator, SwapTimes
from swapgate.drivers import Driver, ProcessDriver, make_driver
from swapgate.drivers.ledger import Ledger
from swapgate.metrics import Metrics
from swapgate.proxy.handler import ProxyEndpoint
from swapgate.proxy.upstream import UpstreamClient
from swapgate.tasks import TaskSet, stop

log = logging.getLogger("swapgate")
# Keys whose change a reload cannot apply to a running server.
RESTART_KEYS = ("host", "port")


@dataclass(frozen=True, slots=True)
class Configured:
    """What one config makes; a reload replaces all of it at once."""

    settings: Settings
    catalog: Catalog
    router: Router
    preloader: Preloader
    poller: Poller
    auth: ClientAuth
    admin_auth: AdminAuth


class Runtime:
    def __init__(self, settings: Settings, config_path: str | Path | None = None) -> None:
        self.config_path = config_path
        catalog = Catalog(settings)
        self.registry = Registry(settings.instances, catalog)
        self.metrics = Metrics()
        self.metrics.watch(self.registry)
        self._control = httpx.AsyncClient()
        self._ledger = Ledger(processes_directory())  # what process instances started
        self.drivers = self._drivers(settings)
        self.coordinator = self._coordinator(settings, catalog)
        # The demand by time of day (auto preloads): alone, kept in a file (read at start,
        # written while auto jobs exist); among replicas, in Redis
        # (swapgate/cluster/shared_demand.py).
        cluster = self.cluster
        self.demand = DayDemand(None if cluster else state_file())
        self._shared_demand = SharedDemand(self.demand, cluster) if cluster else None
        self.registry.waitlist.on_arrival = self.demand.arrived
        self.upstream = UpstreamClient(settings.routing.stream_idle_timeout)
        self.endpoint = ProxyEndpoint(
            registry=self.registry, client=self.upstream, metrics=self.metrics
        )
        self.scheduler: PreloadScheduler | None = None
        self.started = False
        self._poll_task: asyncio.Task[None] | None = None
        self._background = TaskSet()
        self.configured = self._configure(settings, catalog)

    def _coordinator(self, settings: Settings, catalog: Catalog) -> SwapCoordinator:
        """Alone, or among replicas when ``cluster.redis_url_env`` holds a Redis URL."""
        times = SwapTimes(settings.routing.expected_swap)
        parts = (self.registry, self.drivers, catalog, times, self.metrics)
        url = secret(settings.cluster.redis_url_env)
        if url is None:
            return SwapCoordinator(*parts, settings.routing.swap_timeout)
        replica = settings.cluster.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        cluster = Cluster(url, replica, self.metrics)
        return SharedSwaps(*parts, settings.routing.swap_timeout, cluster)

    @property
    def cluster(self) -> Cluster | None:
        shared = self.coordinator.cluster if isinstance(self.coordinator, SharedSwaps) else None
        return shared if isinstance(shared, Cluster) else None

    def _drivers(self, settings: Settings) -> dict[str, Driver]:
        """A driver per instance. A process instance that stays keeps its driver, and so the
        servers it runs; the others are made anew."""
        old: dict[str, Driver] = getattr(self, "drivers", {})
        drivers: dict[str, Driver] = {}
        for inst in settings.instances:
            kept = old.get(inst.name)
            if isinstance(kept, ProcessDriver) and inst.kind == "process":
                kept.reconfigure(inst)
                drivers[inst.name] = kept
                continue
            driver = drivers[inst.name] = make_driver(inst, self._control)
            if isinstance(driver, ProcessDriver):
                self._wire(driver, inst.name)
        return drivers

    def _wire(self, driver: ProcessDriver, instance: str) -> None:
        """What a process instance's events do: metrics, warm state, recycling."""

        def client(model: str) -> str:
            return self.configured.catalog.client_name(instance, model)

        def exited(model: str, code: int) -> None:
            self.metrics.process_exits.labels(instance, client(model)).inc()
            if self.registry.has(instance):
                self.registry.evicted(instance, client(model))  # cold: the next request starts it

        def measured(model: str, rss: int | None) -> None:
            gauge = self.metrics.process_rss
            if rss is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(instance, client(model))
            else:
                gauge.labels(instance, client(model)).set(rss)

        def oversize(model: str, rss: int) -> None:
            if self.registry.has(instance) and self.coordinator.recycle(instance, client(model)):
                log.info("%s/%s is at %d MiB, above its recycle_rss: draining to restart it",
                         instance, model, rss >> 20)  # fmt: skip

        driver.on_exit, driver.on_rss, driver.on_oversize = exited, measured, oversize
        driver.ledger = self._ledger

    async def _close_drivers(self, keep: dict[str, Driver]) -> None:
        for name, driver in list(self.drivers.items()):
            if keep.get(name) is not driver:
                await driver.aclose()

    def _configure(self, settings: Settings, catalog: Catalog) -> Configured:
        """Build what depends on the config alone; live state stays where it is."""
        policy = policy_for(settings, self.coordinator)
        configured = Configured(
            settings=settings,
            catalog=catalog,
            router=Router(
                settings, self.registry, self.coordinator, catalog, self.metrics, self.drivers
            ),
            preloader=Preloader(
                self.registry, self.coordinator, policy, settings.routing.swap_timeout
            ),
            poller=Poller(
                self.registry,
                self.drivers,
                self.metrics,
                settings.routing.poll_interval,
                lambda name: self.coordinator.reconcile(name, policy),
            ),
            auth=ClientAuth(_split_keys(secret(settings.server.api_keys_env))),
            admin_auth=AdminAuth(secret(settings.server.admin_token_env)),
        )
        self.endpoint.configure(settings, configured.router, catalog, configured.auth)
        return configured

    async def start(self) -> None:
        await asyncio.to_thread(self._ledger.sweep)  # what a killed swapgate left behind
        await self.upstream.start()
        if isinstance(self.coordinator, SharedSwaps):
            await self.coordinator.connect()
        await self.configured.poller.poll_all()
        self._poll_task = asyncio.create_task(self.configured.poller.run(), name="poller")
        if self._shared_demand is not None:  # what was learned, before the first auto look
            await self._shared_demand.sync()
            self.spawn(self._shared_demand.run())
        # The scheduler outlives reloads: it takes the preloader of the moment at each run.
        cluster = self.cluster
        self.scheduler = PreloadScheduler(
            lambda: self.configured.preloader,
            self.metrics,
            cluster.leads if cluster else None,
            self.demand,
        )
        self.scheduler.start(self.configured.settings.preloads)
        self._watch_sighup()
        self.started = True
        up = self.registry.up_names()
        log.info("swapgate started: %d of %d instances up", len(up), len(self.drivers))

    async def reload(self) -> Settings:
        """Re-read the config file and apply it; ``ConfigError`` leaves everything as it was."""
        if self.config_path is None:
            raise ConfigError(["no config file to reload: the gateway was started without one"])
        new = load_config(self.config_path)
        for key in RESTART_KEYS:
            if getattr(new.server, key) != getattr(self.configured.settings.server, key):
                log.warning("reload: server.%s changed; it takes effect at the next start", key)
        catalog = Catalog(new)
        drivers = self._drivers(new)
        await self._close_drivers(drivers)  # process instances gone from the config stop
        self.drivers = drivers
        self.registry.reconfigure(new.instances, catalog)
        self.coordinator.reconfigure(self.drivers, catalog, new.routing.swap_timeout)
        self.coordinator.times.expected = new.routing.expected_swap
        self.configured = self._configure(new, catalog)
        await self._restart_poller()
        if self.scheduler is not None:
            self.scheduler.replace(new.preloads)
        log.info("configuration reloaded from %s", self.config_path)
        return new

    def processes(self, instance: str) -> dict[str, dict[str, object]] | None:
        """A process instance's processes and their last output; None for other kinds."""
        driver = self.drivers.get(instance)
        if not isinstance(driver, ProcessDriver):
            return None
        client = self.configured.catalog.client_name
        return {client(instance, model): info for model, info in driver.describe().items()}

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Keep a fire-and-forget task alive until it ends (``?wait=false`` preloads)."""
        self._background.spawn(work)

    async def aclose(self) -> None:
        self.started = False
        if self.scheduler is not None:
            self.scheduler.shutdown()
            self.scheduler.save()
        await stop(self._poll_task)
        await self._background.aclose()
        if self._shared_demand is not None:  # the last arrivals, before the cluster closes
            await self._shared_demand.sync()
        await self.coordinator.aclose()
        await self._close_drivers({})  # every process swapgate started stops
        await self.upstream.aclose()
        await self._control.aclose()

    async def _restart_poller(self) -> None:
        await stop(self._poll_task)
        await self.configured.poller.poll_all()
        self._poll_task = asyncio.create_task(self.configured.poller.run(), name="poller")

    def _watch_sighup(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, lambda: self.spawn(self._reload_logged()))

    async def _reload_logged(self) -> None:
        try:
            await self.reload()
        except ConfigError as exc:
            log.error("SIGHUP reload refused; the running config stays. %s", exc)


def _split_keys(value: str | None) -> list[str]:
    return [key.strip() for key in (value or "").split(",") if key.strip()]
