"""Turning placement decisions into a lease: on a warm instance, or on the model's relay.

``acquire`` places the request, starts the one swap it needs, and waits (re-placing on every
registry change) until the model is warm, unless the model's relay policy sends it to the
relay first (swapgate/policy/relay.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from swapgate.config.catalog import Catalog
from swapgate.config.settings import Settings, secret
from swapgate.control.routing.conversations import Conversations
from swapgate.control.routing.intake import Intake
from swapgate.control.routing.relays import Relays
from swapgate.control.routing.waiter import Routing, Waiter, Waiting
from swapgate.control.state.clients import Clients
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.lease import Lease, Progress, Upstream
from swapgate.data.snapshot import Snapshot
from swapgate.errors import NoCapacity, QueueFull
from swapgate.metrics import Metrics
from swapgate.policy import timing
from swapgate.policy.placement import (
    Decision,
    Full,
    Join,
    Policy,
    Queue,
    Serve,
    Swap,
    Unavailable,
    free_slots,
    frees_up_at,
    place,
    starvation_target,
)
from swapgate.policy.relay import Reason

# Conversations whose last copy is remembered for prefix affinity, the least recent forgotten
# A concurrency limit an instance showed (a 429) holds this long after its last 429; then more
# at once are tried again (a limit is the instance's setting, which may change).
LIMIT_KEPT = 60.0
log = logging.getLogger("swapgate.router")
# How a request found its model (swapgate_placements_total), by its first decision
_PLACEMENT = {
    Serve: "warm",
    Join: "swap",
    Swap: "swap",
    Queue: "queued",
    Full: "queued",
    Unavailable: "swap",
}


class Addresses(Protocol):
    """Where an instance serves a model, when not at its ``url`` (a driver's ``model_url``),
    and the query parameters its requests carry."""

    proxy_query: str

    def model_url(self, model: str) -> str | None: ...


class Router:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        coordinator: SwapCoordinator,
        catalog: Catalog,
        metrics: Metrics,
        addresses: Mapping[str, Addresses] | None = None,
        policy: Policy | None = None,
    ) -> None:
        """``policy``: placement's, as the runtime built it for the preloader and poller too
        (else built here from ``settings``)."""
        self._settings = settings
        self._registry = registry
        self.clock = registry.clock
        self._coordinator = coordinator
        self._catalog = catalog
        self._metrics = metrics
        self._addresses = addresses or {}
        self._policy = policy or policy_for(settings, coordinator.times, registry.names)
        # Where each conversation was served last (prefix affinity, kv_keep)
        self.conversations = Conversations(settings, registry, self._policy, metrics)
        self._upstreams = {
            inst.name: Upstream(
                inst.url,
                secret(inst.api_key_env),
                key_env=inst.api_key_env,
                protocols=frozenset(inst.protocols),
                query=_proxy_query(self._addresses.get(inst.name)),
            )
            for inst in settings.instances
        }
        self.relays = Relays(settings, self.clock, metrics)
        # What each request asks for, read once before it is placed
        self.intake = Intake(settings, registry, catalog, coordinator.times)

    @property
    def clients(self) -> Clients:
        """Who sends the requests (swapgate/control/state/clients.py)."""
        return self._registry.clients

    def snapshot(self, routing: Routing | None = None, holding: str | None = None) -> Snapshot:
        """The registry's snapshot, of the request's pool's instances only; with ``holding``,
        of those holding a copy of that model (warm, loading or asleep) only."""
        pool = routing.pool.instances if routing is not None and routing.pool is not None else None
        if holding is None and pool is None:
            return self._registry.snapshot()
        names = self._registry.copies.of(holding) if holding is not None else self._registry.names()
        if pool is not None:
            names = [name for name in names if name in pool]
        return self._registry.snapshot(names)

    async def acquire(
        self, model: str, progress: Progress | None = None, routing: Routing | None = None
    ) -> Lease:
        """Wait until ``model`` is warm somewhere (starting at most one swap), then lease it;
        or lease its relay when the relay policy says so."""
        started = self.clock()
        progress = progress or Progress()
        routing = routing or Routing()
        self._registry.queues.arrived(model)
        decision = self.place(model, routing, started)
        if isinstance(decision, Serve):
            progress.instance, progress.state = decision.instance, "waiting"
            self._placed(model, "warm", 0.0)
            lease = self.lease(decision.instance, model, None, routing.priority)
        else:
            lease = await self._wait(model, progress, routing, decision, started)
            placement = "relay" if lease.kind == "relay" else _PLACEMENT[type(decision)]
            self._placed(model, placement, lease.waited)
            progress.placement = "full" if isinstance(decision, Full) else placement
            if placement == "swap" and lease.kind == "instance":
                progress.swap_id = self._coordinator.last_swap(lease.name, model)
                if progress.trail is not None:  # tracing: its wait's span links the swap's
                    progress.swap_span = self._coordinator.log.span_of(progress.swap_id)
        self.conversations.remember(model, routing.conversation, lease)
        return lease

    def _placed(self, model: str, placement: str, waited: float) -> None:
        self._metrics.placed(model, placement, waited)

    async def _wait(
        self, model: str, progress: Progress, routing: Routing, decision: Decision, started: float
    ) -> Lease:
        """A request its model is not warm for: wait, relay, or refuse, as the rules say."""
        if routing.budget is not None and not isinstance(decision, Unavailable):
            expected = self.expected_wait(model, decision)
            if expected > routing.budget:
                return self._over_budget(model, decision, expected, routing.budget, started)
        with self._registry.queues.queued(model, started, routing.priority, routing.slots) as depth:
            if depth > self._settings.routing.queue_limit:
                relayed = self.relay(model, "queue_full", started)
                if relayed:
                    return relayed
                raise QueueFull(
                    f"{depth - 1} requests already wait for {model!r}; retry later",
                    retry_after=self.retry_after(model),
                )
            conf = self._settings.model_settings(model)
            max_wait = routing.budget if routing.budget is not None else self.max_wait(model)
            waiter = Waiter(
                self,
                self._registry,
                self._coordinator,
                self._metrics,
                Waiting(
                    model,
                    started,
                    max_wait,
                    self._policy.patience(model),
                    conf.relay_policy,
                    routing,
                ),
                progress,
                decision,
            )
            try:
                lease = await self._registry.changes.until(waiter.step, waiter.deadline)
            finally:
                waiter.release()
        lease = lease or self.relay(model, "error", started)
        if lease is None:
            raise NoCapacity(
                f"{model!r} did not become warm within max_wait ({max_wait:g}s); retry later",
                retry_after=self.retry_after(model),
            )
        return lease

    def acquire_warm(
        self, model: str, besides: str, routing: Routing | None = None
    ) -> Lease | None:
        """Lease another instance (of the request's pool) that has ``model`` warm right now."""
        snap = self.snapshot(routing)
        others = replace(snap, instances=tuple(i for i in snap.instances if i.name != besides))
        decision = place(model, others, self._policy)
        if not isinstance(decision, Serve):
            return None
        return self.lease(decision.instance, model, None, routing.priority if routing else 0)

    def relay(self, model: str, reason: Reason, started: float | None = None) -> Lease | None:
        """Lease the model's relay if its relay policy allows ``reason``."""
        return self.relays.lease(model, reason, started)

    def release(self, lease: Lease) -> None:
        if lease.kind == "instance":
            self._registry.traffic.end_request(lease.name, lease.model, lease.priority)

    def refused_for_limit(self, lease: Lease) -> bool:
        """The instance of ``lease`` refused it for its own concurrency limit (llama-swap's
        ``concurrencyLimit``: a 429): backpressure, not an answer. The registry learns the
        limit (what else is in flight there), the lease goes back, and the request places
        again: into swapgate's queue (``Full``) until one of those ends, or to another warm
        copy. Returns whether any of them is in flight there (else none will end to free one:
        the caller waits the instance's ``Retry-After``)."""
        self._metrics.upstream_errors.labels(lease.name, "concurrency_limit").inc()
        others = self._registry.traffic.limited(lease.name, lease.model, LIMIT_KEPT)
        self.release(lease)
        return others > 0

    def max_wait(self, model: str) -> float:
        """How long a request for ``model`` may wait (its own ``max_wait``, else the routing's)."""
        return self._settings.model_settings(model).max_wait or self._settings.routing.max_wait

    def place(self, model: str, routing: Routing, since: float) -> Decision:
        """Where a request for ``model`` that arrived at ``since`` would go now, among the
        instances of its pool. A free slot of a model with ``max_concurrency`` goes to the
        queued requests first, by class, then arrival: it waits its turn (``Full``).

        Placement looks first among the instances holding a copy of ``model`` (warm, loading
        or asleep: an index, not a walk): where it serves, waits for a slot or joins a load
        depends on those alone. Only a swap or a queue weighs the whole fleet
        (docs/architecture.md, "A fleet of any size")."""
        snap = self.snapshot(routing, holding=model)
        decision = place(model, snap, self._policy, routing.priority)
        if not isinstance(decision, Serve | Full | Join):
            snap = self.snapshot(routing)
            decision = place(model, snap, self._policy, routing.priority)
        if isinstance(decision, Serve) and routing.conversation is not None:
            decision = self.conversations.steer(model, routing.conversation, snap, decision)
        if isinstance(decision, Serve):
            free = free_slots(model, snap, self._policy)
            waitlist = self._registry.queues
            if (
                free is not None
                and waitlist.ahead(model, routing.priority, since, routing.slots) >= free
            ):
                return Full(decision.instance)
        return decision

    def reserve_room(
        self, model: str, until: float, outranks: int | None = None, routing: Routing | None = None
    ) -> str | None:
        """The starvation rule: stop new requests to the cheapest busy victims so they drain;
        returns the instance it made room on, if any, among those of the request's pool. With
        ``outranks``, a request's class: only victims that lower classes alone use
        (swapgate/policy/placement.py)."""
        snap = self.snapshot(routing)
        if any(i.reserved_for == model for i in snap.instances):
            return None  # room is made for another of its requests: one swap serves them all
        target = starvation_target(model, snap, self._policy, outranks)
        if target is None or not target.victims:
            return None
        why = "waits too long" if outranks is None else f"outranks them (class {outranks})"
        log.info("%s %s: closing %s on %s", model, why, target.victims, target.instance)
        self._registry.swap_marks.reserve(target.instance, target.victims, until, model)
        return target.instance

    def expected_wait(self, model: str, decision: Decision) -> float:
        """Seconds until ``model`` would be warm on the decision's instance."""
        if isinstance(decision, Serve | Full | Unavailable):
            return 0.0
        snap = self._registry.snapshot((decision.instance,))
        instance = snap.instance(decision.instance)
        if isinstance(decision, Join):
            return max(0.0, instance.swap_done_by - snap.now)
        eta = self._coordinator.times.eta(decision.instance, model)
        if isinstance(decision, Queue):
            eta += max(0.0, frees_up_at(instance, snap.now, self._policy, snap.unheld) - snap.now)
        return eta

    def _over_budget(
        self, model: str, decision: Decision, expected: float, budget: float, started: float
    ) -> Lease:
        """A request that will not wait as long as ``model`` needs: its relay, if the model's
        fallback relays slow requests, else 503 at once (the swap it needs still starts)."""
        if isinstance(decision, Swap) and self._registry.failing.of(model) is None:
            self._coordinator.start(decision.instance, model, decision.victims)
        relayed = self.relay(model, "slow", started)
        if relayed:
            return relayed
        raise NoCapacity(
            f"{model!r} needs about {expected:.0f}s and the request's x-swapgate-max-wait is"
            f" {budget:g}s; retry later, or without the header to wait",
            retry_after=max(1, math.ceil(expected)),
        )

    def lease(self, instance: str, model: str, started: float | None, priority: int = 0) -> Lease:
        """Lease ``instance``; ``started`` is when the request began waiting, None if it did not."""
        self._registry.traffic.begin_request(instance, model, priority)
        upstream_model = self._catalog.upstream_name(instance, model)
        waited = self.clock() - started if started is not None else 0.0
        upstream = self._upstreams[instance]
        address = self._addresses.get(instance)
        url = address.model_url(upstream_model) if address else None
        if url is not None:  # a process instance: the model's own server
            upstream = replace(upstream, url=url)
        pulse = self._registry.pulse(instance)
        return Lease("instance", instance, model, upstream_model, upstream, waited, pulse, priority)

    def retry_after(self, model: str) -> int:
        quickest = self._coordinator.times.quickest(model, self._registry.names())
        return max(1, math.ceil(quickest))


def _proxy_query(address: Addresses | None) -> str:
    return address.proxy_query if address is not None else ""


def policy_for(
    settings: Settings, times: SwapTimes, instances: Callable[[], Iterable[str]]
) -> Policy:
    """Placement's policy: the config's rules, with the swap times measured so far."""
    routing = settings.routing

    def quickest(model: str) -> float:
        return times.quickest(model, instances())

    return Policy(
        routing.min_residency,
        routing.eviction,
        times.eta,
        routing.demand_horizon,
        patience=lambda model: starvation_point(settings, quickest, model),
        wake=times.wake_eta,
        slots=lambda model: settings.model_settings(model).max_concurrency,
    )


def starvation_point(settings: Settings, quickest: Callable[[str], float], model: str) -> float:
    """How long a request for ``model`` may wait for room before the starvation rule closes a
    busy model for it: ``max_passover``; else ``starvation_after`` of its ``max_wait``; else its
    quickest expected swap, capped at a quarter of ``max_wait`` (swapgate/policy/timing.py)."""
    if settings.routing.max_passover is not None:
        return settings.routing.max_passover
    max_wait = settings.model_settings(model).max_wait or settings.routing.max_wait
    return timing.starvation_point(settings.routing.starvation_after, max_wait, quickest(model))
