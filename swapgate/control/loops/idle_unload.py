"""Idle unload: a warm copy idle its model's ``ttl``, or the ``keep_alive`` its last request
asked for, is unloaded (docs/configuration.md, "Idle unload: ttl and keep_alive").

One task sleeps until the earliest deadline among the copies that have one, and wakes earlier
at a change of the live state (a request ends, a load ends) or when a request asks for its own
timeout. It looks only at the copies of models with a ``ttl`` and the copies a request set a
timeout on: a fleet where nobody uses either costs nothing, and at idle it does not wake until
a deadline comes. The rule is pure (swapgate/policy/idle_timeout.py); an unload goes the way every
eviction does (``SwapSteps.evict``: conversations saved first on ``kv_keep`` instances).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping

from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.data.snapshot import ModelView
from swapgate.data.warm import WarmState
from swapgate.errors import DriverError
from swapgate.metrics import Metrics
from swapgate.policy.idle_timeout import Timeout, timeout_of, unload_at

log = logging.getLogger("swapgate.idle")
# After a change of the live state wakes it, the loop waits this long before it looks: under
# traffic it looks at most a few times a second, whatever the rate of requests.
SETTLE = 0.2
Copy = tuple[str, str]  # (instance, model)
# A warm copy held (a request waits for it, its instance is down) is looked at again this often:
# a waiter that gives up, or a pin set by hand, changes nothing the loop hears.
HELD_RECHECK = 5.0
LONG = 3600.0  # a wait on the change signal with no deadline to meet: it ends at a change


class IdleUnloader:
    def __init__(
        self,
        registry: Registry,
        coordinator: SwapCoordinator,
        metrics: Metrics,
        ttls: Mapping[str, float],
        timeout: float,
        default: float = 0.0,
    ) -> None:
        """``ttls``: each model's own ``ttl`` in seconds (0: never; those with none left out);
        ``timeout``: how long one unload may take (``routing.swap_timeout``); ``default``: the
        ttl of a model that sets none (``routing.ttl``; 0: never)."""
        self._registry = registry
        self._clock = registry.clock
        self._coordinator = coordinator
        self._metrics = metrics
        self._ttls, self._timeout, self._default = dict(ttls), timeout, default
        self._asked: dict[Copy, float | None] = {}  # the last request's keep_alive, by copy
        self._told = asyncio.Event()  # a request asked for a timeout, or a reload came

    def configure(self, ttls: Mapping[str, float], timeout: float, default: float = 0.0) -> None:
        """Take a reloaded config's ``ttl``s; the timeouts requests asked for stay."""
        self._ttls, self._timeout, self._default = dict(ttls), timeout, default
        self._told.set()

    def asked(self, instance: str, model: str, seconds: float | None) -> None:
        """A request served by ``model`` on ``instance`` asked to keep it ``seconds`` idle
        (None: for ever): it replaces the model's ``ttl`` there until another request asks."""
        self._asked[instance, model] = seconds
        self._told.set()

    def timeout(self, instance: str, model: str) -> Timeout:
        copy = (instance, model)
        ttl = self._ttls.get(model, self._default)
        return timeout_of(ttl, self._asked.get(copy), copy in self._asked)

    def deadline(self, instance: str, model: str) -> float | None:
        """When the copy goes if nothing else happens (monotonic), for operators."""
        snap = self._registry.snapshot((instance,))
        if not snap.instances:
            return None
        view = snap.instances[0]
        return unload_at(view, view.models.get(model), self.timeout(instance, model), snap.now)

    async def run(self) -> None:
        while True:
            due, next_at = self.look()
            for instance, models in due.items():
                await self._unload(instance, models)
            if due:
                continue  # their unloads took time: look again first
            await self._sleep(next_at)

    def look(self) -> tuple[dict[str, list[str]], float | None]:
        """The copies due now, by instance, and the next deadline after now (None: none)."""
        watched = self._watched()
        snap = self._registry.snapshot(watched)
        due: dict[str, list[str]] = {}
        next_at = math.inf
        for view in snap.instances:
            for model in watched[view.name]:
                model_view = view.models.get(model)
                if model_view is None or model_view.state is WarmState.COLD:
                    self._asked.pop((view.name, model), None)  # it went: a load starts anew
                timeout = self.timeout(view.name, model)
                at = unload_at(view, model_view, timeout, snap.now)
                if at is None and _warm(model_view) and timeout.seconds is not None:
                    at = snap.now + HELD_RECHECK  # held: what ends a hold may tell no change
                elif at is not None and at <= snap.now:
                    due.setdefault(view.name, []).append(model)
                    continue
                if at is not None:
                    next_at = min(next_at, at)
        return due, next_at if math.isfinite(next_at) else None

    def _ttl_models(self) -> dict[str, None]:
        """The models whose copies have a ttl, in order: with a default, every model held
        somewhere."""
        if self._default > 0:
            held = self._registry.copies.every()
            return {m: None for m in held if self._ttls.get(m, self._default) > 0}
        return {m: None for m, seconds in self._ttls.items() if seconds > 0}

    def _watched(self) -> dict[str, list[str]]:
        """The copies that may have a deadline: a ``ttl`` model's, and those a request set."""
        copies = self._registry.copies
        watched: dict[str, list[str]] = {}
        ttl_models = self._ttl_models()
        for model in ttl_models:
            for instance in copies.of(model):
                watched.setdefault(instance, []).append(model)
        for instance, model in list(self._asked):
            if model not in ttl_models and self._registry.has(instance):
                watched.setdefault(instance, []).append(model)
            elif not self._registry.has(instance):
                del self._asked[instance, model]  # a reload removed the instance
        return watched

    async def _sleep(self, next_at: float | None) -> None:
        """Until the next deadline, a change of the live state, or a request's timeout; with
        no ``ttl`` and no timeout asked anywhere, until a request asks (the warm path's change
        signal stays free while nobody listens)."""
        self._told.clear()
        wait = None if next_at is None else max(0.0, next_at - self._clock())
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self._told.wait())}
        if self._default > 0 or any(s > 0 for s in self._ttls.values()) or self._asked:
            waits.add(asyncio.ensure_future(self._registry.changes.wait(wait or LONG)))
        try:
            await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if next_at is None or self._clock() < next_at:
            await asyncio.sleep(SETTLE)

    async def _unload(self, instance: str, models: list[str]) -> None:
        for model in models:
            if self._still_due(instance, model):
                await self._unload_one(instance, model)

    def _still_due(self, instance: str, model: str) -> bool:
        """Checked again just before the unload (an unload before it took time), in the same
        step as closing the copy to new requests."""
        if self._coordinator.busy(instance):
            return False
        view = self._registry.snapshot((instance,)).instances[0]
        at = unload_at(view, view.models.get(model), self.timeout(instance, model), self._clock())
        return at is not None and at <= self._clock()

    async def _unload_one(self, instance: str, model: str) -> None:
        timeout = self.timeout(instance, model)
        marks = self._registry.swap_marks
        marks.close_for_eviction(instance, (model,))  # no request goes to it from now
        try:
            async with asyncio.timeout(self._timeout):
                await self._coordinator.steps.evict(instance, (model,))
        except (DriverError, TimeoutError) as exc:
            log.warning("idle unload of %s on %s failed: %s", model, instance, exc or "timeout")
            return
        finally:
            marks.reopen_after_eviction(instance)
        self._asked.pop((instance, model), None)  # a load anew starts from the model's ttl
        self._metrics.unloads.labels(instance, model, timeout.reason).inc()
        why = "its ttl" if timeout.reason == "ttl" else "the keep_alive its last request asked"
        said = "idle unload: %s on %s, idle for %s (%s)"
        log.info(said, model, instance, _seconds(timeout.seconds), why)


def _warm(view: ModelView | None) -> bool:
    return view is not None and view.state is WarmState.WARM


def _seconds(seconds: float | None) -> str:
    return "ever" if seconds is None else f"{seconds:g}s"
