"""Turning placement decisions into a lease on an instance: swap, join, queue or give up."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from swapgate.catalog import Catalog
from swapgate.config import Settings, secret
from swapgate.errors import NoCapacity, QueueFull, SwapFailed
from swapgate.placement import Decision, Join, Policy, Queue, Serve, Swap, Unavailable, place
from swapgate.registry import Registry, Snapshot
from swapgate.swaps import SwapCoordinator

# Waiters re-place on every registry change; this bounds how late they notice a residency expiry.
RECHECK_INTERVAL = 0.5
_STATES = {Serve: "waiting", Join: "loading", Swap: "loading", Queue: "queued"}


@dataclass(frozen=True, slots=True)
class Upstream:
    url: str
    api_key: str | None


@dataclass(slots=True)
class Progress:
    """Where a waiting request stands: what keep-alive messages tell the client."""

    instance: str | None = None
    state: str = "placing"  # loading | queued | waiting (for the upstream's answer)


@dataclass(frozen=True, slots=True)
class Lease:
    """A request's claim on a warm model; give it back with ``Router.release``."""

    instance: str
    model: str
    upstream_model: str
    upstream: Upstream
    waited: float


class Router:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        coordinator: SwapCoordinator,
        catalog: Catalog,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._coordinator = coordinator
        self._catalog = catalog
        self._policy = Policy(min_residency=settings.routing.min_residency)
        self._upstreams = {
            inst.name: Upstream(inst.url, secret(inst.api_key_env)) for inst in settings.instances
        }

    async def acquire(self, model: str, progress: Progress | None = None) -> Lease:
        """Wait until ``model`` is warm somewhere (starting at most one swap), then lease it."""
        started = time.monotonic()
        progress = progress or Progress()
        decision = place(model, self._registry.snapshot(), self._policy)
        if isinstance(decision, Serve):
            progress.instance, progress.state = decision.instance, "waiting"
            return self._lease(decision.instance, model, None)
        depth = self._registry.enter_queue(model)
        try:
            if depth > self._settings.routing.queue_limit:
                raise QueueFull(
                    f"{depth - 1} requests already wait for {model!r}; retry later",
                    retry_after=self._retry_after(model),
                )
            return await self._wait(model, decision, started, progress)
        finally:
            self._registry.leave_queue(model)

    def acquire_warm(self, model: str, besides: str) -> Lease | None:
        """Lease another instance that has ``model`` warm right now, if there is one."""
        snap = self._registry.snapshot()
        others = Snapshot(snap.now, tuple(i for i in snap.instances if i.name != besides))
        decision = place(model, others, self._policy)
        return self._lease(decision.instance, model, None) if isinstance(decision, Serve) else None

    def release(self, lease: Lease) -> None:
        self._registry.end_request(lease.instance, lease.model)

    async def _wait(
        self, model: str, decision: Decision, started: float, progress: Progress
    ) -> Lease:
        max_wait = self._settings.model_settings(model).max_wait or self._settings.routing.max_wait
        deadline = started + max_wait
        while True:
            if isinstance(decision, Unavailable):
                error = SwapFailed if decision.backing_off else NoCapacity
                raise error(f"{decision.reason}; retry later", retry_after=self._retry_after(model))
            progress.instance = decision.instance
            progress.state = _STATES[type(decision)]
            if isinstance(decision, Serve):
                return self._lease(decision.instance, model, started)
            if isinstance(decision, Swap):
                self._coordinator.start(decision.instance, model, decision.victims)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoCapacity(
                    f"{model!r} did not become warm within max_wait ({max_wait:g}s); retry later",
                    retry_after=self._retry_after(model),
                )
            await self._registry.wait_for_change(min(remaining, RECHECK_INTERVAL))
            decision = place(model, self._registry.snapshot(), self._policy)

    def _lease(self, instance: str, model: str, started: float | None) -> Lease:
        """Lease ``instance``; ``started`` is when the request began waiting, None if it did not."""
        self._registry.begin_request(instance, model)
        upstream_model = self._catalog.upstream_name(instance, model)
        waited = time.monotonic() - started if started is not None else 0.0
        return Lease(instance, model, upstream_model, self._upstreams[instance], waited)

    def _retry_after(self, model: str) -> int:
        etas = [self._coordinator.times.eta(name, model) for name in self._registry.names()]
        return max(1, math.ceil(min(etas, default=self._settings.routing.expected_swap)))
