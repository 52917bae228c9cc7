"""Making a model warm ahead of demand, on as many instances as asked, and pinning it there.

A preload places like a request (swapgate/policy/placement.py), so it never evicts a pinned model,
one with requests in flight or one inside ``min_residency``; where nothing can make room it waits,
up to ``swap_timeout``, and then reports what it got.
"""

from __future__ import annotations

from dataclasses import dataclass

from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.data.snapshot import Snapshot
from swapgate.data.warm import WarmState
from swapgate.policy.backoff import ATTEMPTS
from swapgate.policy.placement import Policy, Swap, Unavailable, place


@dataclass(frozen=True, slots=True)
class PreloadResult:
    model: str
    instances: tuple[str, ...]  # where it is warm (and pinned) now
    wanted: int
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.instances) >= self.wanted


@dataclass(frozen=True, slots=True)
class _Outcome:
    error: str | None


class Preloader:
    def __init__(
        self, registry: Registry, coordinator: SwapCoordinator, policy: Policy, timeout: float
    ) -> None:
        self._registry = registry
        self._clock = registry.clock
        self._coordinator = coordinator
        self._policy = policy
        self._timeout = timeout

    async def preload(
        self, model: str, count: int = 1, instance: str | None = None, pin_for: float = 0.0
    ) -> PreloadResult:
        started = self._clock()
        wanted = 1 if instance else count
        error = await self._make_warm(model, wanted, instance, started + self._timeout)
        warm = self._warm_on(model, self._registry.snapshot(), instance)[:wanted]
        if pin_for > 0:
            for name in warm:
                self._registry.operator.pin(name, model, self._clock() + pin_for)
        if error is None and len(warm) < wanted:
            error = f"{model!r} is warm on {len(warm)} of {wanted} instances"
        return PreloadResult(model, tuple(warm), wanted, self._clock() - started, error)

    async def _make_warm(
        self, model: str, wanted: int, instance: str | None, deadline: float
    ) -> str | None:
        """None once ``model`` is warm on ``wanted`` instances, else why not. A model whose
        loads fail is tried as a request tries it: ``ATTEMPTS`` loads at most, and a failing
        one only as its probe (swapgate/control/faults/failing.py)."""
        book, since, probing = self._registry.failing, self._clock(), [False]

        def step() -> _Outcome | None:
            snap = self._registry.snapshot()
            warm = self._warm_on(model, snap, instance)
            if len(warm) >= wanted:
                return _Outcome(None)
            decision = place(model, _without(snap, warm, instance), self._policy)
            if isinstance(decision, Unavailable):
                return _Outcome(decision.reason)
            tried, failing = book.since(model, since), book.of(model)
            if len(tried) >= ATTEMPTS or (failing is not None and tried):
                return _Outcome(f"{model!r} failed to load: {tried[-1].error}")
            if isinstance(decision, Swap) and failing is not None and not probing[0]:
                if not book.take_probe(model):
                    return _Outcome(f"{model!r} is failing: {failing.error}")
                probing[0] = True
            if isinstance(decision, Swap):
                self._coordinator.start(decision.instance, model, decision.victims)
            return None

        outcome = await self._registry.changes.until(step, deadline)
        if outcome is None:
            return f"{model!r} was not warm on {wanted} instances within swap_timeout"
        return outcome.error

    def victims(self, model: str) -> tuple[str, ...] | None:
        """What a preload of ``model`` would evict now (nothing: free room); None when it is
        warm or loading already, or nothing may make room."""
        decision = place(model, self._registry.snapshot(), self._policy)
        return decision.victims if isinstance(decision, Swap) else None

    def expected_swap(self, model: str) -> float:
        """The quickest expected swap of ``model`` onto any instance."""
        return self._coordinator.times.quickest(model, self._registry.names())

    @staticmethod
    def _warm_on(model: str, snap: Snapshot, instance: str | None) -> list[str]:
        """Where ``model`` is warm to stay: not where it closes to be evicted (a swap's victim,
        or room for a starving request), which a preload would pin as it leaves."""
        return [
            i.name
            for i in snap.instances
            if i.state_of(model) is WarmState.WARM
            and not i.models[model].closing
            and instance in (None, i.name)
        ]


def _without(snap: Snapshot, warm: list[str], only: str | None) -> Snapshot:
    """The instances a preload may still use: not those that have it, only ``only`` if named."""
    usable = tuple(i for i in snap.instances if i.name not in warm and only in (None, i.name))
    return Snapshot(snap.now, usable)
