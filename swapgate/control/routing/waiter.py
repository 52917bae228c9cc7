"""One request waiting for its model, placed again at every registry change until it is served,
relayed, refused or out of time; the router's ``acquire`` runs it through ``Changes.until``
(docs/architecture.md, the request path)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from swapgate.config.settings import RelayPolicy
from swapgate.control.faults.failing import FailingModels
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.data.lease import Lease, Progress
from swapgate.errors import ModelFailing, NoCapacity, SwapFailed, shown_to_clients
from swapgate.metrics import Metrics
from swapgate.policy import pools
from swapgate.policy.backoff import ATTEMPTS, LoadFailure
from swapgate.policy.placement import Decision, Full, Join, Queue, Serve, Swap, Unavailable
from swapgate.policy.relay import Reason, relay_reason

_STATES = {Serve: "waiting", Join: "loading", Swap: "loading", Queue: "queued", Full: "queued"}


@dataclass(frozen=True, slots=True)
class Routing:
    """A request's own routing: the pool it may use (None: every instance), how long it
    may wait (None: the model's max_wait), its priority class (docs/keys.md) and the
    conversation it belongs to (docs/kv-keep.md) and who sent it."""

    pool: pools.Pool | None = None
    budget: float | None = None
    priority: int = 0
    conversation: str | None = None
    client: str | None = None  # its client key's name (swapgate/control/state/clients.py)

    @property
    def slots(self) -> tuple[str, ...]:
        """The instances whose slots it may take, sorted; () for any."""
        return tuple(sorted(self.pool.instances)) if self.pool is not None else ()


@dataclass(frozen=True, slots=True)
class Waiting:
    """What one wait is for: ``model``, since ``started`` (monotonic), at most ``max_wait``
    seconds; after ``patience`` seconds the starvation rule may make room for it; ``relay_policy``
    says when it goes to the relay instead."""

    model: str
    started: float
    max_wait: float
    patience: float
    relay_policy: RelayPolicy
    routing: Routing
    probing: bool = False  # it took its failing model's probe (control/faults/failing.py)


class Placer(Protocol):
    """What a waiter asks of the router (swapgate/control/routing/router.py)."""

    def place(self, model: str, routing: Routing, since: float) -> Decision: ...
    def lease(
        self, instance: str, model: str, started: float | None, priority: int = 0
    ) -> Lease: ...

    def expected_wait(self, model: str, decision: Decision) -> float: ...
    def relay(self, model: str, reason: Reason, started: float | None = None) -> Lease | None: ...
    def retry_after(self, model: str) -> int: ...
    def reserve_room(
        self, model: str, until: float, outranks: int | None = None, routing: Routing | None = None
    ) -> str | None: ...


class Waiter:
    """One request waiting for its model, placed again at every change (``step``). It holds
    a count on the instance whose swap it awaits, so the model is not evicted before its
    waiters are served (A A A B B, not A B A B), and maybe the room the starvation rule made
    for it; ``release`` gives both back, however the wait ended."""

    def __init__(
        self,
        router: Placer,
        registry: Registry,
        swaps: SwapCoordinator,
        metrics: Metrics,
        wait: Waiting,
        progress: Progress,
        first: Decision,
    ) -> None:
        self._router, self._registry, self._swaps, self._metrics = router, registry, swaps, metrics
        self._wait = wait
        self._progress = progress
        self._first: Decision | None = first  # placed before it queued: used as it was
        self.max_wait = wait.max_wait
        self.deadline = wait.started + wait.max_wait
        self._starving_at = wait.started + wait.patience
        # Where this request waits for a swap of its model, or (``for_slot``) for a free slot
        self._swap_on: str | None = None
        self._for_slot = False
        self._room_on: str | None = None  # where the starvation rule made room for it
        self._started_swap = False  # whether a swap it waits for was started by it
        self._probing = (
            wait.probing
        )  # it tries its failing model once more (control/faults/failing.py)

    def step(self) -> Lease | None:
        router, model, started = self._router, self._wait.model, self._wait.started
        routing = self._wait.routing
        decision = self._first
        if decision is None or isinstance(decision, Queue):  # queued now: placed again
            decision = router.place(model, routing, started)
        self._first = None
        relayed = self._when_loads_fail(decision)
        if relayed is not None:
            return relayed
        held = decision.instance if isinstance(decision, Join | Swap | Full) else None
        self._await_swap_on(held, isinstance(decision, Full))
        if isinstance(decision, Serve):
            self._progress.moved(decision.instance, "waiting")
            if not self._started_swap:  # another request's swap served it too
                self._metrics.swaps_avoided.labels(model).inc()
            return router.lease(decision.instance, model, started, routing.priority)
        if isinstance(decision, Swap):  # also when relaying: later requests find it warm
            began = self._swaps.start(decision.instance, model, decision.victims)
            self._started_swap = self._started_swap or began
        expected = router.expected_wait(model, decision)
        reason = relay_reason(self._wait.relay_policy, decision, expected, self.max_wait)
        relayed = router.relay(model, reason, started) if reason else None
        if relayed:
            return relayed
        if isinstance(decision, Unavailable):
            error = SwapFailed if decision.backing_off else NoCapacity
            if decision.lasting:  # a retry meets the same config: no Retry-After
                raise error(decision.reason)
            raise error(f"{decision.reason}; retry later", retry_after=router.retry_after(model))
        state = _STATES[type(decision)]
        if state == "loading" and self._swaps.waking(decision.instance):
            state = "waking"
        self._progress.moved(decision.instance, state)
        if isinstance(decision, Queue) and self._room_on is None and not self._probing:
            if self._registry.clock() >= self._starving_at:
                self._room_on = router.reserve_room(model, self.deadline, routing=routing)
            else:  # what only lower classes use makes room for it at once
                self._room_on = router.reserve_room(model, self.deadline, routing.priority, routing)
        return None

    def _when_loads_fail(self, decision: Decision) -> Lease | None:
        """Its answer when its model's loads failed: ``ATTEMPTS`` of them since it arrived,
        or one and its model is failing now; or, for a failing model, a load it may not try
        (another probe is not due). The relay where its policy allows (else raises)."""
        model, started = self._wait.model, self._wait.started
        book = self._registry.failing
        tried = book.since(model, started)
        failing = book.of(model) is not None
        needs_load = isinstance(decision, Swap | Queue)
        if failing and isinstance(decision, Swap) and not tried and not self._probing:
            # A probe only where room is free or idle now: it never queues for room
            self._probing = book.take_probe(model)
        refused = (needs_load and not self._probing) or isinstance(decision, Unavailable)
        if len(tried) < ATTEMPTS and not (failing and (tried or refused)):
            return None
        relayed = self._router.relay(model, "error", started)
        if relayed is not None:
            return relayed
        raise loads_failed(model, tried, book)

    def _await_swap_on(self, instance: str | None, for_slot: bool = False) -> None:
        if (self._swap_on, self._for_slot) == (instance, for_slot):
            return
        model = self._wait.model
        if self._swap_on is not None:
            self._registry.traffic.wait_on(self._swap_on, model, -1, for_slot=self._for_slot)
        if instance is not None:
            self._registry.traffic.wait_on(instance, model, +1, for_slot=for_slot)
        self._swap_on, self._for_slot = instance, for_slot

    def release(self) -> None:
        self._await_swap_on(None)
        if self._room_on is not None:  # served, relayed, timed out or gone: room not needed
            self._registry.swap_marks.unreserve(self._room_on, self._wait.model)


def loads_failed(model: str, tried: list[LoadFailure], book: FailingModels) -> SwapFailed:
    """The answer to a request whose model's loads failed: each of its attempts' errors, and
    for a failing model (``ModelFailing``) when swapgate tries it again."""
    attempts = "; ".join(f"on {f.instance}: {shown_to_clients(f.error, lines=3)}" for f in tried)
    failing = book.of(model)
    if failing is None:
        return SwapFailed(
            f"{model!r} failed to load {len(tried)} times ({attempts}); retry later",
            retry_after=1,
        )
    wait = book.retry_after(model)
    said = f"its load failed ({attempts})" if tried else f"its loads fail: {failing.error}"
    return ModelFailing(
        f"{model!r} is failing: {said}; swapgate tries it again in {wait}s, the operator"
        " should look at its engine's log",
        retry_after=wait,
    )
