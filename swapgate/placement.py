"""Where a request for a model goes: a pure function of the model and a registry snapshot.

The rules (SPEC §4.3), in order:
  1. candidates are instances that are up, not drained, not in backoff, and serve the model;
  2. a warm candidate: the one with the fewest in-flight requests per weight;
  3. a candidate already loading the model: join that swap;
  4. a swap target among candidates not swapping already: free capacity first; else one whose
     victims are evictable (not pinned, not used within ``min_residency``, nothing in flight),
     least recently used victims first;
  5. else queue on the candidate expected to free up first.
"""

from __future__ import annotations

from dataclasses import dataclass

from swapgate.registry import InstanceView, Snapshot
from swapgate.state import WarmState


@dataclass(frozen=True, slots=True)
class Policy:
    min_residency: float


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
    warm = [i for i in candidates if i.state_of(model) is WarmState.WARM]
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
    options = [(victims, i) for i in idle if (victims := _victims(i, now, policy)) is not None]
    if not options:
        return None
    victims, instance = min(options, key=lambda o: o[1].models[o[0][0]].last_used)
    return Swap(instance.name, victims)


def _victims(instance: InstanceView, now: float, policy: Policy) -> tuple[str, ...] | None:
    """The least recently used evictable models that make room for one more, if there are."""
    needed = instance.resident - instance.capacity + 1
    evictable = sorted(
        (
            name
            for name, m in instance.models.items()
            if m.state is WarmState.WARM
            and _evictable(m.inflight, m.last_used, m.pinned_until, now, policy)
        ),
        key=lambda name: instance.models[name].last_used,
    )
    return tuple(evictable[:needed]) if len(evictable) >= needed else None


def _evictable(
    inflight: int, last_used: float, pinned_until: float, now: float, policy: Policy
) -> bool:
    recently_used = last_used > 0 and now - last_used < policy.min_residency
    return inflight == 0 and not recently_used and pinned_until <= now


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
