"""Single-flight work per instance: swaps, the restart of a process grown too large, putting
to sleep what is awake beyond capacity, and an operator's unload.

``SwapCoordinator.start`` is synchronous and idempotent per instance: the first caller marks the
model loading and starts the one background task; everyone else finds it loading and joins by
waiting on the registry. A waiter that goes away does not stop the swap. How long swaps take is
``SwapTimes`` (times.py); what a swap does to the instance besides loading is ``SwapSteps``
(steps.py); what learns how each ended is ``SwapOutcomes`` (outcomes.py); what it asks of
other replicas is its ``Claims`` (claims.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swapgate.config.catalog import Catalog
from swapgate.config.settings import EvictionMode
from swapgate.control.memory import pages
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.claims import Claims, SingleReplica
from swapgate.control.swaps.load_progress import LoadProgress
from swapgate.control.swaps.outcomes import SwapOutcomes
from swapgate.control.swaps.steps import SwapSteps
from swapgate.control.swaps.swaplog import SwapLog, eviction_reason
from swapgate.control.swaps.times import Kind, SwapTimes
from swapgate.data.snapshot import AWAKE
from swapgate.data.warm import WarmState
from swapgate.drivers import Driver
from swapgate.errors import DriverError, DriverTimeout, DriverUnreachable
from swapgate.metrics import Metrics
from swapgate.policy import backoff
from swapgate.policy.backoff import WINDOW, Backoff, Blame
from swapgate.policy.placement import Policy, overflow
from swapgate.tasks import stop

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from swapgate.tracing.spans import Tracing

log = logging.getLogger("swapgate.swaps")
# A swap that loads a model evicted from the same instance less than this many of its swap
# times ago is thrash: the eviction cost two swaps and bought little (swapgate_thrash_total).
THRASH_WINDOW = 5.0
# How often a running load looks whether anyone still wants it (a swap nobody waits for is
# abandoned when another model's requests queue behind it).
ABANDON_CHECK = 0.2


@dataclass(slots=True)
class Flight:
    """The one piece of work running in an instance's swap slot."""

    task: asyncio.Task[bool]
    kind: Kind = "load"  # a swap's: load or wake
    tier: str = "unknown"  # where a load reads its weights from


class SwapCoordinator:
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
        claims: Claims | None = None,
        keeper: KvKeeper | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``eviction``: the rule that ranks victims (routing.eviction), named in the log;
        ``backoff_window``: two models failing within it back off their whole instance;
        ``claims``: what a swap asks of the other replicas (alone: nothing); ``keeper``:
        conversations saved before an unload on ``kv_keep`` instances; ``tracing``: each swap
        a span (swapgate/tracing/), a child of the request that started it."""
        self._registry = registry
        self._clock = registry.clock
        self.claims = claims or SingleReplica()
        self.steps = SwapSteps(registry, drivers, catalog, self.claims, keeper)
        self.times = times
        self._metrics = metrics
        self._swap_timeout = swap_timeout
        self._flights: dict[str, Flight] = {}  # by instance
        self._eviction = eviction
        self.log = SwapLog(tracing=tracing)  # the last swaps, for operators; their spans
        # How far each running load has got, as a real figure (control/swaps/load_progress.py)
        self.progress = LoadProgress(
            self._clock, catalog.weights, pages.resident, pages.size, self.steps.load_stage
        )
        # What learns how each swap ended: the registry, the backoff, the log, the metrics
        self.outcomes = SwapOutcomes(
            registry, Backoff(self._clock, backoff_window), self.log, self.progress, times, metrics
        )
        registry.failing.window = backoff_window

    def start(self, instance: str, model: str, victims: tuple[str, ...] = ()) -> bool:
        """Begin swapping ``model`` onto ``instance`` unless a swap runs there already."""
        if instance in self._flights:
            return False
        view = self._registry.snapshot().instance(instance)
        kind: Kind = "wake" if view.state_of(model) is WarmState.ASLEEP else "load"
        tier = self.times.tiers(model) if kind == "load" else "unknown"
        eta = self.times.eta(instance, model, kind, tier)
        left = self.steps.left_at(instance, model)
        if left is not None and self._clock() - left < THRASH_WINDOW * eta:
            self._metrics.thrash.labels(instance, model).inc()
        reason = eviction_reason(view, victims, self._eviction)
        self.log.begin(instance, model, kind, victims, reason, eta)
        shown_eta = None if kind == "load" and self.times.guessing() else eta
        self.progress.began(instance, model, shown_eta, waking=kind == "wake")
        self._registry.swap_marks.begin_swap(instance, model, eta)
        # No request goes to a victim any more, from now: not one placed before the swap's task
        # first runs (it would be served as its model is unloaded), nor one sent to a vLLM
        # server going to sleep (it would wait, unanswered, for its next wake).
        self._registry.swap_marks.close_for_eviction(instance, victims)
        self._fly(instance, self._swap(instance, model, victims), "swap", kind, tier)
        return True

    def recycle(self, instance: str, model: str) -> bool:
        """Restart ``model`` on ``instance`` (a process grown too large): from now on its new
        requests wait for the restart or go where it is warm; the ones it serves finish first,
        then it stops and starts again, bounded by ``swap_timeout`` like a swap. Not counted
        as a swap. False if a swap runs there already (the next poll asks again)."""
        if instance in self._flights:
            return False
        self._registry.swap_marks.begin_swap(instance, model, self.times.eta(instance, model))
        self._fly(instance, self._restart(instance, model), "recycle")
        return True

    def reconcile(self, instance: str, policy: Policy) -> bool:
        """Put back to sleep what is awake on ``instance`` beyond its capacity, where the engine
        keeps every copy awake until told (``Driver.trims_to_capacity``: vLLM's servers start
        awake, and wake for anyone who asks). Runs in the instance's swap slot; False when
        there is nothing to do, or a swap runs there (the next poll looks again)."""
        driver = self.steps.drivers.get(instance)
        if driver is None or not driver.trims_to_capacity or instance in self._flights:
            return False
        snap = self._registry.snapshot()
        view = snap.instance(instance)
        extra = overflow(view, snap, policy) if view.up else ()
        if not extra:
            return False
        self._fly(instance, self._trim(instance, extra), "trim")
        return True

    async def unload(self, instance: str, model: str) -> None:
        """Evict ``model`` from ``instance`` for an operator; raises ``DriverError``."""
        await self.steps.evict(instance, (model,))
        self._registry.operator.unpin(instance, model)

    def _fly(
        self,
        instance: str,
        work: Coroutine[Any, Any, bool],
        what: str,
        kind: Kind = "load",
        tier: str = "unknown",
    ) -> None:
        """Run ``work`` in ``instance``'s one swap slot until it ends."""
        task = asyncio.create_task(work, name=f"{what} {instance}")
        self._flights[instance] = Flight(task, kind, tier)
        task.add_done_callback(lambda _: self._flights.pop(instance, None))

    def busy(self, instance: str) -> bool:
        return instance in self._flights

    def waking(self, instance: str) -> bool:
        """Whether the swap running on ``instance`` wakes a sleeping model (keep-alives say so)."""
        flight = self._flights.get(instance)
        return flight is not None and flight.kind == "wake"

    async def wait(self, instance: str) -> bool:
        """Wait for the swap running on ``instance``; True when it made its model warm."""
        flight = self._flights.get(instance)
        return await asyncio.shield(flight.task) if flight else False

    def last_swap(self, instance: str, model: str) -> int | None:
        """The id, in the swap log, of the latest swap of ``model`` onto ``instance``: the one
        a request just served there after waiting for a swap waited for."""
        return self.log.last_of(instance, model)

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
        self.steps.drivers, self.steps.catalog = drivers, catalog
        self._swap_timeout = swap_timeout
        self.progress.reconfigure(catalog.weights)
        self.times.sizes = catalog.weight_bytes()  # a reload may name other weights
        self.times.expected = expected_swap
        self._eviction = eviction
        self.outcomes.backoff.window = self._registry.failing.window = backoff_window

    async def aclose(self) -> None:
        await stop(*(flight.task for flight in self._flights.values()))

    async def _swap(self, instance: str, model: str, victims: tuple[str, ...]) -> bool:
        try:
            if not await self.claims.claim(instance, model):
                return False  # another replica swaps there (swapgate/cluster/swaps.py)
            try:
                return await self._run(instance, model, victims)
            finally:
                await self.claims.released(instance, model)
        finally:
            self._registry.swap_marks.reopen_after_eviction(instance)  # if it never ran
            record = self.log.running_on(instance)
            if record is not None:  # handed to another replica's swap, or shut down
                self.log.end(record, "handed over", 0.0)

    async def _run(self, instance: str, model: str, victims: tuple[str, ...]) -> bool:
        steps = self.steps
        driver = steps.drivers[instance]
        started = self._clock()
        log.info("swap start: %s on %s (evicting %s)", model, instance, list(victims) or "none")
        self.log.enter(instance)  # its span, in the swap's own task: its kv saves its children
        warm, error = False, ""
        blame: Blame = "model"
        try:
            await steps.save(instance, victims)  # within kv_keep's own save_timeout
            async with asyncio.timeout(self._swap_timeout):
                if victims:  # nothing healthy goes for a model that surely cannot load
                    await driver.check_loadable(steps.catalog.upstream_name(instance, model))
                await steps.evict(instance, victims)
                warm, wanted = await self._load(instance, model, driver)
                await steps.loaded(instance, model)
        except (DriverError, TimeoutError) as exc:
            result = "timeout" if isinstance(exc, TimeoutError) else "failed"
            log.warning("swap %s: %s on %s: %s", result, model, instance, exc or "swap_timeout")
            error = str(exc) or "swap_timeout"
            blame = _blame(self._registry, instance, model, exc)
        except asyncio.CancelledError:
            self._registry.swap_marks.end_swap(instance, model, ok=False)  # no backoff
            raise
        except Exception as exc:  # a bug (ours or a driver's): a failed swap, not a stuck one
            self._metrics.internal_errors.labels("swap").inc()
            log.exception("swap failed: %s on %s: a fault of swapgate's own", model, instance)
            result, error = "failed", f"swapgate failed loading it ({type(exc).__name__})"
        else:
            result = "ok" if wanted else "abandoned"
        finally:
            self._registry.swap_marks.reopen_after_eviction(instance)
        flight = self._flights.get(instance)
        kind, tier = (flight.kind, flight.tier) if flight else ("load", "unknown")
        elapsed = self._clock() - started
        return self.outcomes.record(
            instance, model, (result, kind, tier), elapsed, warm, error, blame
        )

    async def _load(self, instance: str, model: str, driver: Driver) -> tuple[bool, bool]:
        """Load ``model``: (warm, wanted). Unwanted once every request that waited for it went
        away while another model's requests queue for ``instance``: a driver that can stops
        the load, the others finish it and the model is then the first victim."""
        upstream = self.steps.catalog.upstream_name(instance, model)
        load = asyncio.ensure_future(driver.load(upstream))
        # Requests that wait count themselves before they start a swap; preloads never do.
        traffic = self._registry.traffic
        waited, wanted = traffic.waiting_on(instance, model) > 0, True
        try:
            while not (await asyncio.wait({load}, timeout=ABANDON_CHECK))[0]:
                waiting = traffic.waiting_on(instance, model)
                waited = waited or waiting > 0
                if not wanted or not waited or waiting or not self.claims.abandons:
                    continue
                if not traffic.queued_behind(instance, model):
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

    async def _trim(self, instance: str, models: tuple[str, ...]) -> bool:
        if not await self.claims.may_trim():
            return False
        named, them = ", ".join(models), "them" if len(models) > 1 else "it"
        log.info("%s has %s awake beyond its capacity: putting %s to sleep", instance, named, them)
        self._registry.swap_marks.close_for_eviction(instance, models)
        try:
            await self.steps.save(instance, models)
            async with asyncio.timeout(self._swap_timeout):
                await self.steps.evict(instance, models)
        except (DriverError, TimeoutError) as exc:
            why = exc or "swap_timeout"
            log.warning("%s: putting %s to sleep failed: %s", instance, named, why)
            return False
        finally:
            self._registry.swap_marks.reopen_after_eviction(instance)
        return True

    async def _restart(self, instance: str, model: str) -> bool:
        steps = self.steps
        driver, upstream = steps.drivers[instance], steps.catalog.upstream_name(instance, model)
        try:
            while self._registry.snapshot().instance(instance).models[model].inflight:
                await self._registry.changes.wait(1.0)
            log.info("recycle: restarting %s on %s", model, instance)
            async with asyncio.timeout(self._swap_timeout):
                await steps.unload(instance, model)
                await driver.load(upstream)
                await steps.loaded(instance, model)
        except (DriverError, TimeoutError) as exc:
            log.warning("recycle failed: %s on %s: %s", model, instance, exc or "swap_timeout")
            return self.outcomes.settle(instance, model, ok=False, error=str(exc) or "swap_timeout")
        except asyncio.CancelledError:
            self._registry.swap_marks.end_swap(instance, model, ok=False)
            raise
        self._metrics.process_recycles.labels(instance, model).inc()
        return self.outcomes.settle(instance, model, ok=True)


def _blame(registry: Registry, instance: str, model: str, exc: Exception) -> Blame:
    """Whose fault a failed load is: the instance's, or the model's (policy/backoff.py)."""
    view = registry.snapshot((instance,)).instance(instance)
    others = any(m != model and v.state in AWAKE for m, v in view.models.items())
    unreachable = isinstance(exc, DriverUnreachable)
    timed_out = isinstance(exc, TimeoutError | DriverTimeout)
    return backoff.blame(
        str(exc), unreachable=unreachable, timed_out=timed_out, others_resident=others
    )
