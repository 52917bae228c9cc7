"""Where a request for a model goes: a pure function of the model and a registry snapshot.

The rules (SPEC §4.3), in order:
  1. candidates are instances that are up, not drained, not in backoff, and serve the model;
  2. a warm candidate: the one with the fewest in-flight requests per weight;
  3. a candidate already loading the model: join that swap;
  4. a swap target among candidates not swapping already: free capacity first; else one whose
     victims are evictable (not pinned, not used within ``min_residency``, nothing in flight,
     no request waiting for it), the cheapest victims first: least recently used (``lru``), or
     least expected cost, request rate × measured swap time (``demand``);
  5. else queue on the candidate expected to free up first.

A model "closing" on an instance (the starvation rule, ``starvation_target``) takes no new
requests there and is evictable once its in-flight requests are done, residency or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from swapgate.registry import InstanceView, ModelView, Snapshot
from swapgate.state import WarmState

Eviction = Literal["lru", "demand"]


def _unmeasured(instance: str, model: str) -> float:
    return 1.0


@dataclass(frozen=True, slots=True)
class Policy:
    min_residency: float
    eviction: Eviction = "lru"
    # The measured swap time of (instance, model): what evicting a model costs when it returns.
    eta: Callable[[str, str], float] = _unmeasured


@dataclass(frozen=True, slots=True)
class Serve:
    instance: str


@dataclass(frozen=True, slots=True)
class Join:
    instance: str


@dataclass(frozen=True, slots=True)
class Swap:
    instance: str
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Queue:
    instance: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    reason: str
    backing_off: bool = False  # a candidate is out only because a swap failed on it


Decision = Serve | Join | Swap | Queue | Unavailable


def place(model: str, snap: Snapshot, policy: Policy) -> Decision:
    candidates = [i for i in snap.instances if model in i.serves and i.available(snap.now)]
    if not candidates:
        backing_off = any(
            model in i.serves and i.up and not i.drained and snap.now < i.backoff_until
            for i in snap.instances
        )
        return Unavailable(_why_unavailable(model, snap), backing_off)
    warm = [
        i for i in candidates if i.state_of(model) is WarmState.WARM and not i.models[model].closing
    ]
    if warm:
        return Serve(min(warm, key=_load).name)
    loading = [i for i in candidates if i.state_of(model) is WarmState.LOADING]
    if loading:
        return Join(min(loading, key=lambda i: i.swap_done_by).name)
    return _swap_target(model, candidates, snap.now, policy) or Queue(
        min(candidates, key=lambda i: frees_up_at(i, snap.now, policy)).name
    )


def _swap_target(
    model: str, candidates: list[InstanceView], now: float, policy: Policy
) -> Swap | None:
    idle = [i for i in candidates if i.swapping is None]
    free = [i for i in idle if i.resident < i.capacity]
    if free:
        return Swap(min(free, key=_load).name)
    cheapest = _cheapest_room(idle, now, policy, drain=False)
    return Swap(cheapest[0].name, cheapest[1]) if cheapest else None


def starvation_target(model: str, snap: Snapshot, policy: Policy) -> Swap | None:
    """Where to make room for ``model`` by closing models that still serve: the instance whose
    unpinned victims cost least, counting their in-flight requests as drainable."""
    idle = [
        i
        for i in snap.instances
        if model in i.serves and i.available(snap.now) and i.swapping is None
    ]
    cheapest = _cheapest_room(idle, snap.now, policy, drain=True)
    return Swap(cheapest[0].name, cheapest[1]) if cheapest else None


def _cheapest_room(
    instances: list[InstanceView], now: float, policy: Policy, drain: bool
) -> tuple[InstanceView, tuple[str, ...]] | None:
    options = [
        (i, victims) for i in instances if (victims := _victims(i, now, policy, drain)) is not None
    ]
    if not options:
        return None
    return min(options, key=lambda o: _room_cost(o[0], o[1], policy))


def _victims(
    instance: InstanceView, now: float, policy: Policy, drain: bool = False
) -> tuple[str, ...] | None:
    """The cheapest evictable models that make room for one more, if there are enough."""
    needed = instance.resident - instance.capacity + 1
    evictable = sorted(
        (n for n, m in instance.models.items() if _evictable(m, now, policy, drain)),
        key=lambda name: _victim_cost(instance, name, policy),
    )
    return tuple(evictable[:needed]) if len(evictable) >= needed else None


def _evictable(m: ModelView, now: float, policy: Policy, drain: bool) -> bool:
    if m.state is not WarmState.WARM or m.pinned_until > now:
        return False
    if drain:
        return True  # in-flight requests finish first; residency yields to a starving request
    recently_used = not m.closing and m.last_used > 0 and now - m.last_used < policy.min_residency
    return m.inflight == 0 and m.waiting == 0 and not recently_used


def _victim_cost(instance: InstanceView, name: str, policy: Policy) -> tuple[float, float]:
    """Sort key of a victim: (expected cost of its return, last use) — last use alone for LRU."""
    m = instance.models[name]
    if policy.eviction == "demand":
        return (m.rate * policy.eta(instance.name, name), m.last_used)
    return (0.0, m.last_used)


def _room_cost(
    instance: InstanceView, victims: tuple[str, ...], policy: Policy
) -> tuple[float, float]:
    costs = [_victim_cost(instance, v, policy) for v in victims]
    return (sum(c[0] for c in costs), max(c[1] for c in costs))


def frees_up_at(instance: InstanceView, now: float, policy: Policy) -> float:
    """When the instance can next take a swap: its running swap's end, else the earliest
    residency expiry among its warm models (in-flight and pins only make it later)."""
    if instance.swapping is not None:
        return instance.swap_done_by
    expiries = [
        max(m.last_used + policy.min_residency, m.pinned_until)
        for m in instance.models.values()
        if m.state is WarmState.WARM
    ]
    return min(expiries, default=now)


def _load(instance: InstanceView) -> float:
    return instance.load


def _why_unavailable(model: str, snap: Snapshot) -> str:
    serving = [i for i in snap.instances if model in i.serves]
    if not serving:
        return f"no instance serves {model!r}"
    states = ", ".join(f"{i.name} {_condition(i, snap.now)}" for i in serving)
    return f"no instance can serve {model!r} right now ({states})"


def _condition(instance: InstanceView, now: float) -> str:
    if not instance.up:
        return "is down"
    if instance.drained:
        return "is drained"
    return f"backs off after a failed swap for {instance.backoff_until - now:.0f}s more"
