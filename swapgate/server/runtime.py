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
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from swapgate.activity.captures import Captures
from swapgate.activity.log import ActivityLog
from swapgate.config.catalog import Catalog
from swapgate.config.loading import load_config
from swapgate.config.paths import processes_directory, state_directory
from swapgate.config.settings import ConfigError, ProcessCommand, Settings, secret
from swapgate.control.loops.decay import DecayWatch
from swapgate.control.loops.forecast import DayDemand, state_file
from swapgate.control.loops.idle_unload import IdleUnloader
from swapgate.control.loops.poller import Poller
from swapgate.control.loops.preload import Preloader
from swapgate.control.loops.probe import Prober
from swapgate.control.loops.scheduler import PreloadScheduler
from swapgate.control.memory.host_cache import HostCache
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.routing.key_limits import KeyLimits
from swapgate.control.routing.router import Router, policy_for
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.drivers import Driver, ProcessDriver, make_driver
from swapgate.drivers.children import Guard
from swapgate.drivers.http import control_client
from swapgate.drivers.ledger import Ledger
from swapgate.live_gauges import EngineRow
from swapgate.metrics import Metrics
from swapgate.policy.diagnosis import STATES
from swapgate.proxy.auth import AdminAuth, ClientAuth
from swapgate.proxy.handler import ProxyEndpoint
from swapgate.proxy.records import RequestRecords
from swapgate.proxy.upstream import UpstreamClient
from swapgate.tasks import TaskSet, stop
from swapgate.tracing import tracing_for

# Redis's client costs a tenth of a second of every start: the cluster's modules are imported by
# a gateway that has replicas, when it builds them.
if TYPE_CHECKING:
    from swapgate.cluster.demand import SharedDemand
    from swapgate.cluster.key_counts import SharedCounts
    from swapgate.cluster.kv_slots import SharedSlots
    from swapgate.cluster.store import Cluster
    from swapgate.cluster.swaps import OperatorShares, SharedClaims

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
    prober: Prober


class Runtime:
    def __init__(self, settings: Settings, config_path: str | Path | None = None) -> None:
        self.config_path = config_path
        catalog = Catalog(settings)
        self.metrics = Metrics()
        self._control = control_client()
        self._ledger = Ledger(processes_directory(), Guard())  # what process instances started
        self.drivers = self._drivers(settings, kept={})
        # Among replicas (a Redis URL in cluster.redis_url_env), the state they share
        # (swapgate/cluster/): swap locks, events, pins and drains, the demand by time of day.
        self.cluster = _cluster(settings, self.metrics)
        clock = time.monotonic  # the one clock of the live state, read through the registry
        # The demand by time of day (auto preloads): alone, kept in a file (read at start,
        # written while auto jobs exist); among replicas, in Redis.
        self.demand = DayDemand(None if self.cluster else state_file())
        shares, shared_slots = self._replicas(clock)
        # Each request, swap and preload a span, when an OTLP endpoint is set (a restart
        # applies a change of it): swapgate/tracing/
        self.tracing = tracing_for(
            settings.tracing.endpoint, settings.tracing.sample_ratio, self.metrics
        )
        self.registry = Registry(
            settings.instances, catalog, clock, on_arrival=self.demand.arrived, shares=shares
        )
        registry = self.registry
        self.metrics.watch(registry.snapshot, registry.queues.depths, registry.failing.gauge)
        self.metrics.watch_memory(self.registry.polls.measured)  # docs/memory.md, "Measured memory"
        self.scheduler: PreloadScheduler | None = None
        # The cached tier: the next models' weights in RAM ahead of their swap (docs/host-cache.md)
        self.host_cache = HostCache(
            settings.host_cache, catalog.weights, self.registry, self.metrics, self._upcoming
        )
        # Conversations saved across swaps on kv_keep instances (control/memory/kv/)
        self.kv = KvKeeper(self._control, self.metrics, shared=shared_slots, tracing=self.tracing)
        self.kv.configure(settings.instances)
        self.shared, self.coordinator = self._swaps(settings, catalog, shares)
        self.metrics.watch_progress(self.coordinator.progress.ratios)
        self.upstream = UpstreamClient(settings.routing.stream_idle_timeout)
        # Each key's use (docs/keys.md): outlives reloads, counted across replicas in Redis.
        self.limits = KeyLimits(clock, self._shared_counts)
        # Each engine's TTFT against its baseline, its memory slope, the probes (docs/operations.md)
        self.decay = DecayWatch(settings.diagnosis, clock)
        self.metrics.watch_decay(self.engine_rows, STATES)
        # Each request's row, and the bodies captures want (docs/operations.md, "Activity")
        self.activity = _activity_log(settings)
        self.captures = Captures(self.activity, settings.capture)
        # Copies idle their model's ttl, or their last request's keep_alive, are unloaded
        self.idle = IdleUnloader(
            self.registry, self.coordinator, self.metrics, _ttls(settings),
            settings.routing.swap_timeout, settings.routing.ttl,
        )  # fmt: skip
        self.endpoint = self._endpoint(settings)
        self._idle_task: asyncio.Task[None] | None = None
        self._host_cache_task: asyncio.Task[None] | None = None
        self.started = False
        self._poll_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._background = TaskSet()
        self.configured = self._configure(settings, catalog)

    def _replicas(
        self, clock: Callable[[], float]
    ) -> tuple[OperatorShares | None, SharedSlots | None]:
        """Among replicas (a cluster), what they share besides swaps: pins and drains, the
        demand by time of day, each key's use (docs/keys.md) and kv_keep's slot books."""
        self._shared_demand: SharedDemand | None = None
        self._shared_counts: SharedCounts | None = None
        if not self.cluster:
            return None, None
        from swapgate.cluster.demand import SharedDemand
        from swapgate.cluster.key_counts import SharedCounts
        from swapgate.cluster.kv_slots import SharedSlots
        from swapgate.cluster.swaps import OperatorShares

        self._shared_demand = SharedDemand(self.demand, self.cluster)
        self._shared_counts = SharedCounts(self.cluster)
        return OperatorShares(self.cluster, clock), SharedSlots(self.cluster)

    def _swaps(
        self, settings: Settings, catalog: Catalog, shares: OperatorShares | None
    ) -> tuple[SharedClaims | None, SwapCoordinator]:
        """The swap coordinator, given the host cache's tiers, the KV keeper and, among
        replicas, what a swap asks of the others (cluster/swaps.py)."""
        routing = settings.routing
        times = SwapTimes(routing.expected_swap, catalog.weight_bytes(), self.host_cache.tier)
        shared = None
        if self.cluster and shares:
            from swapgate.cluster.swaps import SharedClaims

            shared = SharedClaims(self.registry, times, self.cluster, shares)
        coordinator = SwapCoordinator(
            self.registry, self.drivers, catalog, times, self.metrics, routing.swap_timeout,
            eviction=routing.eviction, backoff_window=routing.backoff_window,
            claims=shared, keeper=self.kv, tracing=self.tracing,
        )  # fmt: skip
        return shared, coordinator

    def _endpoint(self, settings: Settings) -> ProxyEndpoint:
        """The data plane, with what outlives reloads (its config comes in ``_configure``)."""
        return ProxyEndpoint(
            registry=self.registry,
            client=self.upstream,
            metrics=self.metrics,
            limits=self.limits,
            records=RequestRecords(
                self.registry,
                self.metrics,
                self.decay,
                self.activity if settings.activity.enabled else None,
                self.captures,
                self.tracing,
                self.idle.asked,
            ),
            kv=self.kv,
            figures=self.coordinator.progress.figure,
        )

    def _drivers(self, settings: Settings, kept: Mapping[str, Driver]) -> dict[str, Driver]:
        """A driver per instance. A process instance that stays keeps its driver (in ``kept``),
        and so the servers it runs; the others are made anew."""
        drivers: dict[str, Driver] = {}
        for inst in settings.instances:
            own = kept.get(inst.name)
            if isinstance(own, ProcessDriver) and inst.kind == "process":
                own.reconfigure(inst)
                drivers[inst.name] = own
                continue
            watch = _ProcessWatch(self, inst.name)
            drivers[inst.name] = make_driver(inst, self._control, watch, self._ledger)
        return drivers

    async def _close_drivers(self, keep: dict[str, Driver]) -> None:
        for name, driver in list(self.drivers.items()):
            if keep.get(name) is not driver:
                await driver.aclose()

    def _configure(self, settings: Settings, catalog: Catalog) -> Configured:
        """Build what depends on the config alone; live state stays where it is."""
        policy = policy_for(settings, self.coordinator.times, self.registry.names)
        router = Router(
            settings, self.registry, self.coordinator, catalog, self.metrics, self.drivers, policy
        )
        configured = Configured(
            settings=settings,
            catalog=catalog,
            router=router,
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
            auth=ClientAuth(
                _split_keys(secret(settings.server.api_keys_env)),
                settings.auth.keys,
                settings.server.api_keys_env,
            ),
            admin_auth=AdminAuth(
                secret(settings.server.admin_token_env), secret(settings.auth.viewer_token_env)
            ),
            prober=Prober(settings, router, self.decay, self.metrics, self._control),
        )
        self.decay.configure(settings.diagnosis)
        self.endpoint.configure(settings, configured.router, catalog, configured.auth)
        return configured

    async def start(self) -> None:
        await asyncio.to_thread(self._ledger.sweep)  # what a killed swapgate left behind
        self.activity.start()
        await self.upstream.start()
        if self.shared is not None:
            await self.shared.connect()
        if self._shared_counts is not None:
            keys = self.configured.settings.auth.keys
            await self._shared_counts.forget([k.name for k in keys if k.concurrency])
        await self.configured.poller.poll_all()
        self._poll_task = asyncio.create_task(self.configured.poller.run(), name="poller")
        self._start_probes()
        if self._shared_demand is not None:  # what was learned, before the first auto look
            await self._shared_demand.sync()
            self.spawn(self._shared_demand.run())
        # The scheduler outlives reloads: it takes the preloader of the moment at each run.
        self.scheduler = PreloadScheduler(
            lambda: self.configured.preloader,
            self.metrics,
            self.cluster.leads if self.cluster else None,
            self.demand,
            self.tracing,
        )
        self.scheduler.start(self.configured.settings.preloads)
        self._host_cache_task = asyncio.create_task(self.host_cache.run(), name="host cache")
        self._idle_task = asyncio.create_task(self.idle.run(), name="idle unload")
        self._watch_sighup()
        settle_heap()
        self.started = True
        up = self.registry.up_names()
        log.info("swapgate started: %d of %d instances up", len(up), len(self.drivers))

    async def describe_cluster(self) -> dict[str, Any] | None:
        """What Redis says of the replicas, the swap locks, and each limited key's use across
        the replicas (docs/keys.md); None when not clustered."""
        if self.cluster is None:
            return None
        described = await self.cluster.describe()
        if self._shared_counts is not None:
            keys = self.configured.settings.auth.keys
            live = {str(r["id"]) for r in described["replicas"]}
            rated = [k.name for k in keys if k.rpm]
            slotted = [k.name for k in keys if k.concurrency]
            described["keys"] = await self._shared_counts.use(rated, slotted, live)
        return described

    async def reload(self) -> Settings:
        """Re-read the config file and apply it; ``ConfigError`` leaves everything as it was."""
        if self.config_path is None:
            raise ConfigError(["no config file to reload: the gateway was started without one"])
        new = load_config(self.config_path)
        for key in RESTART_KEYS:
            if getattr(new.server, key) != getattr(self.configured.settings.server, key):
                log.warning("reload: server.%s changed; it takes effect at the next start", key)
        catalog = Catalog(new)
        drivers = self._drivers(new, kept=self.drivers)
        await self._close_drivers(drivers)  # process instances gone from the config stop
        self.drivers = drivers
        self.registry.reconfigure(new.instances, catalog)
        routing = new.routing
        self.coordinator.reconfigure(
            self.drivers,
            catalog,
            routing.swap_timeout,
            routing.expected_swap,
            routing.eviction,
            routing.backoff_window,
        )
        self.configured = self._configure(new, catalog)
        await self._restart_poller()
        await stop(self._probe_task)
        self._start_probes()
        if self.scheduler is not None:
            self.scheduler.replace(new.preloads)
        self.host_cache.reconfigure(new.host_cache, catalog.weights)
        self.kv.configure(new.instances)
        self.captures.set_config(new.capture)  # on or off without a restart
        self.idle.configure(_ttls(new), new.routing.swap_timeout, new.routing.ttl)
        settle_heap()  # what the old config made may go; the new one joins the long-lived
        log.info("configuration reloaded from %s", self.config_path)
        return new

    def processes(self, instance: str) -> dict[str, dict[str, object]] | None:
        """A process instance's processes and their last output; None for other kinds."""
        driver = self.drivers.get(instance)
        if not isinstance(driver, ProcessDriver):
            return None
        client = self.configured.catalog.client_name
        return {client(instance, model): info for model, info in driver.describe().items()}

    def _upcoming(self) -> list[tuple[float, str]]:
        return self.scheduler.upcoming() if self.scheduler is not None else []

    @property
    def control_client(self) -> httpx.AsyncClient:
        """The control plane's one HTTP client (swapgate/drivers/http.py)."""
        return self._control

    def spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Keep a fire-and-forget task alive until it ends (``?wait=false`` preloads)."""
        self._background.spawn(work)

    async def aclose(self) -> None:
        self.started = False
        if self.scheduler is not None:
            self.scheduler.shutdown()
            self.scheduler.save()
        await stop(self._poll_task, self._probe_task, self._host_cache_task, self._idle_task)
        await self._background.aclose()
        if self._shared_demand is not None:  # the last arrivals, before the cluster closes
            await self._shared_demand.sync()
        await self.coordinator.aclose()
        if self.shared is not None:
            await self.shared.aclose()
        await self._close_drivers({})  # every process swapgate started stops
        self._ledger.close()
        await self.upstream.aclose()
        await self._control.aclose()
        await self.activity.close()  # what is buffered is written first
        if self.tracing is not None:  # the spans queued go out (within the exporter's timeout)
            await asyncio.to_thread(self.tracing.shutdown)

    def _start_probes(self) -> None:
        prober = self.configured.prober
        self._probe_task = (
            asyncio.create_task(prober.run(), name="probes") if prober.wanted else None
        )

    def engine_rows(self) -> list[EngineRow]:
        """Each warm engine's decay figures and diagnosis, for the metrics; the series of
        engines no longer warm are dropped."""
        settings = self.configured.settings
        rows: list[EngineRow] = []
        warm = set()
        for model, names in self.registry.copies.every().items():  # looked up, not the whole fleet
            for name in names:
                if self.registry.warm_since(name, model) is None:
                    continue  # loading or asleep
                warm.add((name, model))
                relay = settings.model_settings(model).relay
                state, figures = self.decay.diagnosis(name, model, relay)
                rows.append((name, model, figures.drift, figures.rss_slope, state))
        self.decay.forget_gone(warm)
        return rows

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


def settle_heap() -> None:
    """Move what exists once the gateway is up (modules, the app, the config, pools, parsers)
    out of the cyclic garbage collector's reach: it lives as long as the process, and a full
    collection then scans only what requests made. Without it each full collection scanned
    ~98,000 objects for 60–80 ms, during which every request in flight stood still: the warm
    path's p99 at 16 clients was 50–60 ms against the bare passthrough's ~22 ms
    (docs/benchmarks.md). Unfrozen and collected first, so that what a reload replaced goes.
    How often the collector runs is the process's to say: ``serve()`` sets it."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _cluster(settings: Settings, metrics: Metrics) -> Cluster | None:
    """This replica's side of the shared state, when ``cluster.redis_url_env`` holds a URL."""
    url = secret(settings.cluster.redis_url_env)
    if url is None:
        return None
    from swapgate.cluster.store import Cluster

    replica = settings.cluster.replica_id or f"{socket.gethostname()}-{os.getpid()}"
    return Cluster(url, replica, metrics)


def _activity_log(settings: Settings) -> ActivityLog:
    """The activity log's database: ``activity.path``, else this gateway's own file in the
    state directory, named by its port (two gateways on one host never read or write each
    other's rows); in memory when that is ``:memory:``."""
    config = settings.activity
    own = state_directory() / f"activity-{settings.server.port}.sqlite3"
    path = config.path or str(own)
    where = None if path == ":memory:" else Path(path).expanduser()
    return ActivityLog(where, max_rows=config.max_rows, max_age=config.max_age)


def _split_keys(value: str | None) -> list[str]:
    return [key.strip() for key in (value or "").split(",") if key.strip()]


def _ttls(settings: Settings) -> dict[str, float]:
    """Each model's own ``ttl`` (docs/configuration.md, "Idle unload: ttl and keep_alive");
    a model that sets none has ``routing.ttl``."""
    return {name: model.ttl for name, model in settings.models.items() if model.ttl is not None}


class _ProcessWatch:
    """What a process instance's events do (swapgate/drivers/process.py's ``ProcessEvents``):
    metrics, warm state, recycling."""

    def __init__(self, runtime: Runtime, instance: str) -> None:
        self._runtime = runtime
        self._instance = instance

    def _client(self, model: str) -> str:
        return self._runtime.configured.catalog.client_name(self._instance, model)

    def exited(self, model: str, code: int) -> None:
        runtime, instance = self._runtime, self._instance
        runtime.metrics.process_exits.labels(instance, self._client(model)).inc()
        if runtime.registry.has(instance):
            runtime.registry.swap_marks.evicted(
                instance, self._client(model)
            )  # cold: the next request starts it

    def measured(self, model: str, rss: int | None, command: ProcessCommand | None) -> None:
        runtime, instance, client = self._runtime, self._instance, self._client(model)
        gauge = runtime.metrics.process_rss
        if rss is None:
            with contextlib.suppress(KeyError):
                gauge.remove(instance, client)
            return
        gauge.labels(instance, client).set(rss)
        since = runtime.registry.warm_since(instance, client)
        if since is None:
            return
        slope = runtime.decay.outgrown(instance, client, since, rss, command)
        if (
            slope is not None
            and command is not None
            and runtime.coordinator.recycle(instance, client)
        ):
            log.info(
                "%s/%s grows %d MiB/h over %.0fs, past its recycle_rss_slope: draining to "
                "restart it",
                instance,
                model,
                slope / 2**20,
                command.slope_window,
            )

    def oversize(self, model: str, rss: int) -> None:
        runtime, instance = self._runtime, self._instance
        if runtime.registry.has(instance) and runtime.coordinator.recycle(
            instance, self._client(model)
        ):
            log.info(
                "%s/%s is at %d MiB, above its recycle_rss: draining to restart it",
                instance,
                model,
                rss >> 20,
            )
