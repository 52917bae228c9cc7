"""Single-flight swaps per instance, their measured durations, and the ETA they feed.

``SwapCoordinator.start`` is synchronous and idempotent per instance: the first caller marks the
model loading and starts the one background task; everyone else finds it loading and joins by
waiting on the registry. A waiter that goes away does not stop the swap.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal, Protocol

from swapgate.config.catalog import Catalog
from swapgate.config.settings import EvictionMode
from swapgate.control.memory import pages
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.load_progress import LoadProgress
from swapgate.control.swaps.swaplog import SwapLog, eviction_reason
from swapgate.data.warm import Stage, WarmState
from swapgate.drivers import Driver
from swapgate.errors import DriverError, shown_to_clients
from swapgate.metrics import Metrics
from swapgate.policy.backoff import WINDOW, Backoff
from swapgate.policy.placement import Policy, overflow
from swapgate.policy.timing import EXPECTED_SWAP
from swapgate.tasks import stop

log = logging.getLogger("swapgate.swaps")
RECENT_SWAPS = 5
# A swap either loads a cold model or wakes one asleep (vLLM's sleep mode, docs/configuration.md).
Kind = Literal["load", "wake"]
EXPECTED_WAKE = 5.0  # a wake not measured yet is expected this long (or a load's ETA if less)
# A swap that loads a model evicted from the same instance less than this many of its swap
# times ago is thrash: the eviction cost two swaps and bought little (swapgate_thrash_total).
THRASH_WINDOW = 5.0
# How often a running load looks whether anyone still wants it (a swap nobody waits for is
# abandoned when another model's requests queue behind it).
ABANDON_CHECK = 0.2


class Swaps(Protocol):
    """What the router and the preloader ask of the swap coordinator."""

    def start(self, instance: str, model: str, victims: tuple[str, ...] = ()) -> bool: ...
    def eta(self, instance: str, model: str) -> float: ...
    def quickest(self, model: str) -> float: ...
    def wake_eta(self, instance: str, model: str) -> float: ...
    def waking(self, instance: str) -> bool: ...
    def last_swap(self, instance: str, model: str) -> int | None: ...
    def tiers(self, model: str) -> str: ...  # where its weights would be read from: cached...


class SwapTimes:
    """The swap ETA per tier: median of the last five measured loads (or wakes, of a model
    asleep) of (instance, model), by where its weights were read from (``cached``: the page
    cache; ``cold``: disk; ``unknown``), else of its loads from anywhere. Before one was
    measured: ``expected`` (the operator's ``expected_swap``) if set, else what was measured
    nearest to it (swapgate/policy/timing.py): its loads elsewhere; else, where its weights'
    size is known and so is the rate other loads read theirs at, that size over that rate;
    else the other loads on its instance, else any."""

    def __init__(self, expected: float | None, sizes: Mapping[str, int] | None = None) -> None:
        """``sizes``: the bytes of each model's weights, where known (catalog.weight_bytes)."""
        self.expected = expected
        self.sizes = dict(sizes or {})
        self._recent: dict[tuple[str, str, Kind, str], deque[float]] = {}
        self._latest: dict[tuple[str, str, Kind], float] = {}

    def record(
        self, instance: str, model: str, seconds: float, kind: Kind = "load", tier: str = "unknown"
    ) -> None:
        key = (instance, model, kind, tier)
        self._recent.setdefault(key, deque(maxlen=RECENT_SWAPS)).append(seconds)
        self._latest[instance, model, kind] = seconds

    def eta(self, instance: str, model: str, kind: Kind = "load", tier: str | None = None) -> float:
        recent = self._recent.get((instance, model, kind, tier or "unknown"))
        if not recent:  # not measured from that tier: from any
            tiers = [
                t
                for (i, m, k, _), t in self._recent.items()
                if (i, m, k) == (instance, model, kind)
            ]
            recent = deque(x for times in tiers for x in times)
        if recent:
            return statistics.median(recent)
        if kind == "wake":  # never expected to take longer than loading it
            return min(self.eta(instance, model), EXPECTED_WAKE)
        return self.expected if self.expected is not None else self._nearest(instance, model)

    def last(self, instance: str, model: str, kind: Kind = "load") -> float:
        """The last measured swap of (instance, model); 0 if none."""
        return self._latest.get((instance, model, kind), 0.0)

    def _nearest(self, instance: str, model: str) -> float:
        """The median of the latest loads of ``model`` elsewhere, else of other models on
        ``instance``, else of any; ``EXPECTED_SWAP`` before the first."""
        loads = {
            (i, m): seconds for (i, m, kind), seconds in self._latest.items() if kind == "load"
        }
        elsewhere = [t for (_, m), t in loads.items() if m == model]
        if elsewhere:
            return statistics.median(elsewhere)
        rates = [self.sizes[m] / t for (_, m), t in loads.items() if self.sizes.get(m) and t > 0]
        if self.sizes.get(model) and rates:  # its bytes at the rate the others read theirs
            return self.sizes[model] / statistics.median(rates)
        for near in ([t for (i, _), t in loads.items() if i == instance], list(loads.values())):
            if near:
                return statistics.median(near)
        return EXPECTED_SWAP


def _unknown_tier(model: str) -> str:
    return "unknown"


class SwapCoordinator:
    # Alone, a replica sees every request that waits for a swap; among replicas it does not
    # (shared.py), so only a replica alone abandons swaps.
    abandons = True

    def __init__(
        self,
        registry: Registry,
        drivers: Mapping[str, Driver],
        catalog: Catalog,
        times: SwapTimes,
        metrics: Metrics,
        swap_timeout: float,
        *,
        eviction: EvictionMode = "lru",
        backoff_window: float = WINDOW,
    ) -> None:
        """``eviction``: the rule that ranks victims (routing.eviction), named in the log;
        ``backoff_window``: two models failing within it back off their whole instance."""
        self._registry = registry
        self._clock = registry.clock
        self._drivers = drivers
        self._catalog = catalog
        self.times = times
        self._metrics = metrics
        self._swap_timeout = swap_timeout
        self._running: dict[str, asyncio.Task[bool]] = {}
        self._kinds: dict[str, Kind] = {}  # what each running swap does: load or wake
        self._tiers: dict[str, str] = {}  # where each running load reads its weights from
        # Where a model's weights would be read from now: the host cache says (host_cache.py)
        self.tiers: Callable[[str], str] = _unknown_tier
        # Conversations saved before an unload, on kv_keep instances (control/memory/kv.py)
        self.keeper: KvKeeper | None = None
        self._evicted_at: dict[tuple[str, str], float] = {}  # (instance, model): when it left
        self._backoff = Backoff(self._clock, backoff_window)
        self._eviction = eviction
        self.log = SwapLog()  # the last swaps, for operators
        # How far each running load has got, as a real figure (control/swaps/load_progress.py)
        self.progress = LoadProgress(
            self._clock, catalog.weights, pages.resident, pages.size, self._load_stage
        )

    def start(self, instance: str, model: str, victims: tuple[str, ...] = ()) -> bool:
        """Begin swapping ``model`` onto ``instance`` unless a swap runs there already."""
        if instance in self._running:
            return False
        view = self._registry.snapshot().instance(instance)
        kind: Kind = "wake" if view.state_of(model) is WarmState.ASLEEP else "load"
        self._kinds[instance] = kind
        tier = self._tiers[instance] = self.tiers(model) if kind == "load" else "unknown"
        eta = self.times.eta(instance, model, kind, tier)
        left = self._evicted_at.pop((instance, model), None)
        if left is not None and self._clock() - left < THRASH_WINDOW * eta:
            self._metrics.thrash.labels(instance, model).inc()
        reason = eviction_reason(view, victims, self._eviction)
        self.log.begin(instance, model, kind, victims, reason, eta)
        self.progress.began(instance, model, eta, waking=kind == "wake")
        self._registry.swap_marks.begin_swap(instance, model, eta)
        self._occupy(instance, self._swap(instance, model, victims), "swap")
        return True

    def recycle(self, instance: str, model: str) -> bool:
        """Restart ``model`` on ``instance`` (a process grown too large): from now on its new
        requests wait for the restart or go where it is warm; the ones it serves finish first,
        then it stops and starts again, bounded by ``swap_timeout`` like a swap. Not counted
        as a swap. False if a swap runs there already (the next poll asks again)."""
        if instance in self._running:
            return False
        self._registry.swap_marks.begin_swap(instance, model, self.times.eta(instance, model))
        self._occupy(instance, self._recycle(instance, model), "recycle")
        return True

    def reconcile(self, instance: str, policy: Policy) -> bool:
        """Put back to sleep what is awake on ``instance`` beyond its capacity, where the engine
        keeps every copy awake until told (``Driver.trims_to_capacity``: vLLM's servers start
        awake, and wake for anyone who asks). Runs in the instance's swap slot; False when
        there is nothing to do, or a swap runs there (the next poll looks again)."""
        driver = self._drivers.get(instance)
        if driver is None or not driver.trims_to_capacity or instance in self._running:
            return False
        snap = self._registry.snapshot()
        view = snap.instance(instance)
        extra = overflow(view, snap, policy) if view.up else ()
        if not extra:
            return False
        self._occupy(instance, self._trim(instance, extra), "trim")
        return True

    def _occupy(self, instance: str, work: Coroutine[Any, Any, bool], what: str) -> None:
        """Run ``work`` in ``instance``'s one swap slot until it ends."""
        task = asyncio.create_task(work, name=f"{what} {instance}")
        self._running[instance] = task
        task.add_done_callback(lambda _: self._running.pop(instance, None))

    def eta(self, instance: str, model: str) -> float:
        """Seconds a swap of ``model`` onto ``instance`` is expected to take, from where its
        weights would be read now (``cached`` or ``cold``)."""
        return self.times.eta(instance, model, "load", self.tiers(model))

    def quickest(self, model: str) -> float:
        """The quickest swap of ``model`` expected onto any instance."""
        names = self._registry.names()
        return min((self.eta(name, model) for name in names), default=self.eta("", model))

    def last_swap(self, instance: str, model: str) -> int | None:
        """The id, in the swap log, of the latest swap of ``model`` onto ``instance``: the one
        a request just served there after waiting for a swap waited for."""
        return self.log.last_of(instance, model)

    def wake_eta(self, instance: str, model: str) -> float:
        """Seconds waking ``model``, asleep on ``instance``, is expected to take."""
        return self.times.eta(instance, model, "wake")

    def waking(self, instance: str) -> bool:
        """Whether the swap running on ``instance`` wakes a sleeping model (keep-alives say so)."""
        return instance in self._running and self._kinds.get(instance) == "wake"

    async def wait(self, instance: str) -> bool:
        """Wait for the swap running on ``instance``; True when it made its model warm."""
        task = self._running.get(instance)
        return await asyncio.shield(task) if task else False

    def _load_stage(self, instance: str, model: str) -> Stage | None:
        """How far ``model``'s load on ``instance`` has got, as its engine announces it."""
        driver = self._drivers.get(instance)
        upstream = self._catalog.upstream_name(instance, model)
        return driver.load_stage(upstream) if driver is not None else None

    def busy(self, instance: str) -> bool:
        return instance in self._running

    async def unload(self, instance: str, model: str) -> None:
        """Evict ``model`` from ``instance`` for an operator; raises ``DriverError``."""
        await self._unload(instance, model, self._drivers[instance])
        self._evicted(instance, model)
        self._registry.operator.unpin(instance, model)

    def reconfigure(
        self,
        drivers: Mapping[str, Driver],
        catalog: Catalog,
        swap_timeout: float,
        expected_swap: float | None,
        eviction: EvictionMode,
        backoff_window: float = WINDOW,
    ) -> None:
        """Take a reloaded config; swaps already running finish with what they started with."""
        self._drivers, self._catalog, self._swap_timeout = drivers, catalog, swap_timeout
        self.progress.reconfigure(catalog.weights)
        self.times.sizes = catalog.weight_bytes()  # a reload may name other weights
        self.times.expected = expected_swap
        self._eviction = eviction
        self._backoff.window = backoff_window

    async def aclose(self) -> None:
        await stop(*self._running.values())

    async def _swap(self, instance: str, model: str, victims: tuple[str, ...]) -> bool:
        try:
            if not await self._claim(instance, model):
                return False  # another replica swaps there (swapgate/cluster/swaps.py)
            try:
                return await self._run(instance, model, victims)
            finally:
                await self._released(instance, model)
        finally:
            record = self.log.running_on(instance)
            if record is not None:  # handed to another replica's swap, or shut down
                self.log.end(record, "handed over", 0.0)

    async def _run(self, instance: str, model: str, victims: tuple[str, ...]) -> bool:
        driver = self._drivers[instance]
        started = self._clock()
        log.info("swap start: %s on %s (evicting %s)", model, instance, list(victims) or "none")
        warm, error = False, ""
        # No request goes to a victim any more: one sent to a vLLM server going to sleep
        # would wait, unanswered, for its next wake.
        self._registry.swap_marks.leaving(instance, victims)
        try:
            await self._keep(instance, victims, driver)  # within kv_keep's own save_timeout
            async with asyncio.timeout(self._swap_timeout):
                if victims:  # nothing healthy goes for a model that surely cannot load
                    await driver.check_loadable(self._catalog.upstream_name(instance, model))
                await self._evict(instance, victims, driver)
                warm, wanted = await self._load(instance, model, driver)
                await self._started(instance, model)
        except (DriverError, TimeoutError) as exc:
            result = "timeout" if isinstance(exc, TimeoutError) else "failed"
            log.warning("swap %s: %s on %s: %s", result, model, instance, exc or "swap_timeout")
            error = str(exc) or "swap_timeout"
        except asyncio.CancelledError:
            self._registry.swap_marks.end_swap(
                instance, model, ok=False
            )  # shutting down: no backoff
            raise
        else:
            result = "ok" if wanted else "abandoned"
        finally:
            self._registry.swap_marks.stayed(instance)
        return self._finish(instance, model, result, self._clock() - started, warm, error)

    async def _evict(self, instance: str, models: tuple[str, ...], driver: Driver) -> None:
        for model in models:
            await self._unload(instance, model, driver)
            self._evicted(instance, model)

    async def _unload(self, instance: str, model: str, driver: Driver) -> None:
        """Unload ``model``, its conversations saved first where the instance keeps them."""
        await self._keep(instance, (model,), driver)
        await driver.unload(self._catalog.upstream_name(instance, model))

    async def _keep(self, instance: str, models: tuple[str, ...], driver: Driver) -> None:
        """Save the conversations of ``models``, about to leave ``instance``, where it keeps
        them (control/memory/kv/keeper.py): each model once, within ``kv_keep.save_timeout``."""
        keeper = self.keeper
        if keeper is None or not keeper.keeps(instance):
            return
        for model in models:
            upstream = self._catalog.upstream_name(instance, model)
            own = driver.model_url(upstream)
            server = keeper.server(instance, own or driver.url, upstream, driver.headers)
            await keeper.save(instance, model, server)

    async def _started(self, instance: str, model: str) -> None:
        """``model`` was loaded anew on ``instance``: its engine's slots are empty."""
        if self.keeper is not None:
            await self.keeper.loaded(instance, model)

    async def _trim(self, instance: str, models: tuple[str, ...]) -> bool:
        if not await self._may_trim():
            return False
        log.info("%s has %s awake beyond its capacity: putting %s to sleep", instance,
                 ", ".join(models), "them" if len(models) > 1 else "it")  # fmt: skip
        self._registry.swap_marks.leaving(instance, models)
        try:
            await self._keep(instance, models, self._drivers[instance])
            async with asyncio.timeout(self._swap_timeout):
                await self._evict(instance, models, self._drivers[instance])
        except (DriverError, TimeoutError) as exc:
            log.warning("%s: putting %s to sleep failed: %s", instance, ", ".join(models),
                        exc or "swap_timeout")  # fmt: skip
            return False
        finally:
            self._registry.swap_marks.stayed(instance)
        return True

    async def _load(self, instance: str, model: str, driver: Driver) -> tuple[bool, bool]:
        """Load ``model``: (warm, wanted). Unwanted once every request that waited for it went
        away while another model's requests queue for ``instance``: a driver that can stops
        the load, the others finish it and the model is then the first victim."""
        load = asyncio.ensure_future(driver.load(self._catalog.upstream_name(instance, model)))
        # Requests that wait count themselves before they start a swap; preloads never do.
        waited, wanted = self._registry.traffic.waiting_on(instance, model) > 0, True
        try:
            while not (await asyncio.wait({load}, timeout=ABANDON_CHECK))[0]:
                waiting = self._registry.traffic.waiting_on(instance, model)
                waited = waited or waiting > 0
                if not wanted or not waited or waiting or not self.abandons:
                    continue
                if not self._registry.traffic.queued_behind(instance, model):
                    continue
                wanted = False
                log.info("swap abandoned: nobody waits for %s on %s any more", model, instance)
                if driver.cancels_loads:
                    load.cancel()
                    await asyncio.wait({load})
                    if load.cancelled():  # else it ended first: warm (or failed), as it ended
                        return False, False
        finally:
            if not load.done():  # swap_timeout or shutdown: the load goes with the swap
                load.cancel()
                await asyncio.wait({load})
        load.result()  # raises the load's DriverError
        return True, wanted

    # What a replica among others does around a swap (SharedSwaps): alone, nothing.

    async def _claim(self, instance: str, model: str) -> bool:
        """Whether this swap may run; False once it was handed to another replica's."""
        return True

    async def _released(self, instance: str, model: str) -> None:
        """The swap ended (``_finish`` told the registry how)."""

    async def _may_trim(self) -> bool:
        """Whether this replica puts what is over capacity to sleep (alone: always)."""
        return True

    def _evicted(self, instance: str, model: str) -> None:
        self._evicted_at[instance, model] = self._clock()
        driver = self._drivers.get(instance)
        self._registry.swap_marks.evicted(
            instance, model, driver.evicts_to if driver else WarmState.COLD
        )

    async def _recycle(self, instance: str, model: str) -> bool:
        driver, upstream = self._drivers[instance], self._catalog.upstream_name(instance, model)
        try:
            while self._registry.snapshot().instance(instance).models[model].inflight:
                await self._registry.changes.wait(1.0)
            log.info("recycle: restarting %s on %s", model, instance)
            async with asyncio.timeout(self._swap_timeout):
                await self._unload(instance, model, driver)
                await driver.load(upstream)
                await self._started(instance, model)
        except (DriverError, TimeoutError) as exc:
            log.warning("recycle failed: %s on %s: %s", model, instance, exc or "swap_timeout")
            return self._end(instance, model, ok=False, error=str(exc) or "swap_timeout")
        except asyncio.CancelledError:
            self._registry.swap_marks.end_swap(instance, model, ok=False)
            raise
        self._metrics.process_recycles.labels(instance, model).inc()
        return self._end(instance, model, ok=True)

    def _end(self, instance: str, model: str, ok: bool, error: str = "") -> bool:
        """The registry and the backoff learn how a swap (or restart) ended: a failure backs
        off the model there, and the whole instance when another of its models failed lately."""
        if ok:
            self._backoff.succeeded(instance, model)
            self._registry.swap_marks.end_swap(instance, model, ok=True)
            return ok
        verdict = self._backoff.failed(instance, model)
        if verdict.instance:
            log.warning("%s backs off for %.0fs: two or more of its models failed to "
                        "load within %.0fs", instance, verdict.instance,
                        self._backoff.window)  # fmt: skip
        marks = self._registry.swap_marks
        marks.end_swap(instance, model, False, verdict.model, whole=verdict.instance,
                       failure=shown_to_clients(error))  # fmt: skip
        return ok

    def _finish(
        self, instance: str, model: str, result: str, elapsed: float, warm: bool, error: str = ""
    ) -> bool:
        record = self.log.running_on(instance)
        if record is not None:
            self.log.end(record, result, elapsed, error)
        self.progress.ended(instance, model)
        if result == "abandoned" and not warm:  # stopped, not failed: no backoff
            self._registry.swap_marks.end_swap(instance, model, ok=False)
        else:
            self._end(instance, model, warm, error)
        if result == "abandoned" and warm:
            self._registry.swap_marks.mark_abandoned(instance, model)
        kind = self._kinds.get(instance, "load")
        tier = self._tiers.pop(instance, "unknown")
        self._metrics.swap_duration.labels(instance, model, result, tier).observe(elapsed)
        self._metrics.swaps.labels(instance, model, result).inc()
        if kind == "wake":
            self._metrics.wake_duration.labels(instance, model, result).observe(elapsed)
        if warm:
            self.times.record(instance, model, elapsed, kind, tier)
            log.info("swap done (%s): %s on %s in %.2fs", kind, model, instance, elapsed)
        return warm
