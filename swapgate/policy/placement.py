"""Where a request for a model goes: a pure function of the model and a registry snapshot.

The rules (docs/architecture.md), in order:
  1. candidates are instances that are up, not drained, not in backoff, and serve the model
     where its own server answers (vLLM's sleep mode: one per model); one where a load of the
     model failed lately (its own backoff) may serve it warm or join its load, but not load it;
  2. a warm candidate with a free slot (``max_concurrency``): the one with the fewest in-flight
     requests per weight; warm everywhere but every slot taken: wait for one (``Full``);
  3. a candidate already loading the model: join that swap;
  4. a swap target among candidates not swapping already — a copy asleep (vLLM's sleep mode)
     before a cold one when its measured wake is sooner than the cold one's load —: free
     capacity first; else one whose
     victims are evictable (not pinned, nothing in flight, no request waiting for it, and not
     used within its residency (``min_residency``, or its swap time when unset:
     swapgate/policy/timing.py), unless every client that used it lately waits, with all it
     can have open, for other models (``snap.unheld``: swapgate/control/state/clients.py)
     (``lru``) or more likely gone than back (``demand``; the
     longer this model's requests have queued, the likelier back a victim may be, up to any
     at the starvation rule's point)), the cheapest victims first: least recently used
     (``lru``), or least expected cost (``demand``): the chance of its next request within
     the horizon × its measured swap time, nothing if another instance has it warm too;
  5. first come, first swapped, by priority class first (docs/keys.md): if a model whose
     requests are of a higher class, or of the same class and have queued longer, would take
     that same swap target, it goes first and this request queues behind it;
  6. else queue on the candidate expected to free up first.

A model "closing" on an instance (the starvation rule, ``starvation_target``) takes no new
requests there and is evictable once its in-flight requests are done, residency or not; the room
it leaves is reserved for the starving model. A request of a higher class than every request
using the models in its way does not wait for that point (``outranks``), unless their own
requests have waited that long.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

from swapgate.config.settings import EvictionMode
from swapgate.config.sizes import human
from swapgate.data.snapshot import AWAKE, InstanceView, Snapshot
from swapgate.data.warm import WarmState
from swapgate.policy.timing import residency

# Under ``demand``, a model is kept while its next request within the horizon is this likely.
LIKELY_BACK = 0.5
# Victims for a model by memory: every set of up to this many evictable models is weighed (2^12
# sets at most); beyond it the cheapest are taken one by one until there is room.
EXACT_SETS = 12


def _unmeasured(instance: str, model: str) -> float:
    return 1.0


def _never(model: str) -> float:
    return float("inf")


def _unlimited(model: str) -> int | None:
    return None


@dataclass(frozen=True, slots=True)
class Policy:
    # Set: the operator's min_residency; None: follow the swap time it guards (timing.py).
    min_residency: float | None
    eviction: EvictionMode = "lru"
    # The measured swap time of (instance, model): what evicting a model costs when it returns.
    eta: Callable[[str, str], float] = _unmeasured
    # Under ``demand``: how far ahead a victim's next request counts, in its swap times.
    horizon: float = 3.0
    # Under ``demand``: how long a model's requests may queue before any model that is done
    # may make room for it, however likely back (the bar rises from LIKELY_BACK to 1 meanwhile).
    patience: Callable[[str], float] = _never
    # The measured wake of (instance, model) asleep (vLLM's sleep mode): the asleep tier's time.
    wake: Callable[[str, str], float] = _unmeasured
    # A model's ``max_concurrency``: its requests at once on one instance (None: no cap).
    slots: Callable[[str], int | None] = _unlimited

    def residency(self, instance: str, model: str) -> float:
        """How long ``model``, having served a request on ``instance``, stays unevictable."""
        return residency(self.min_residency, self.eta(instance, model))


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
class Full:
    """Warm, but every one of its slots (``max_concurrency``) is taken: wait for one."""

    instance: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    reason: str
    backing_off: bool = False  # a candidate is out only because a swap failed on it
    # No retry helps: no instance serves the model, or it is larger than all their memory
    lasting: bool = False


Decision = Serve | Join | Swap | Queue | Full | Unavailable


def place(model: str, snap: Snapshot, policy: Policy, priority: int = 0) -> Decision:
    """Where a request for ``model`` of class ``priority`` goes now."""
    candidates = [
        i
        for i in snap.instances
        if model in i.serves
        and i.available(snap.now)
        and i.reachable(model)
        and _room_for(i, model)
    ]
    warm = [i for i in candidates if _serves_warm(i, model)]
    if warm:
        open_ = [i for i in warm if _open_slots(i, model, policy) != 0]
        if open_:
            return Serve(min(open_, key=_load).name)
        return Full(min(warm, key=lambda i: i.models[model].inflight).name)
    loading = [i for i in candidates if i.state_of(model) is WarmState.LOADING]
    if loading:
        return Join(min(loading, key=lambda i: i.swap_done_by).name)
    candidates = [i for i in candidates if not i.backing_off(model, snap.now)]
    if not candidates:
        reason, lasting = _why_unavailable(model, snap)
        return Unavailable(reason, _backing_off(model, snap), lasting)
    target = _swap_target(model, candidates, snap, policy)
    if target is None:
        frees = lambda i: frees_up_at(i, snap.now, policy, snap.unheld)  # noqa: E731
        return Queue(min(candidates, key=frees).name)
    if _queued_earlier(model, target.instance, snap, policy, priority):
        return Queue(target.instance)
    return target


def open_copies(model: str, snap: Snapshot, policy: Policy) -> dict[str, int]:
    """The warm copies of ``model`` that take a request now, each with its requests in
    flight: where a request placed warm may go (prefix affinity chooses among them)."""
    return {
        i.name: i.inflight
        for i in snap.instances
        if model in i.serves
        and i.available(snap.now)
        and i.reachable(model)
        and _serves_warm(i, model)
        and _open_slots(i, model, policy) != 0
    }


def free_slots(model: str, snap: Snapshot, policy: Policy) -> int | None:
    """How many more requests for ``model`` its warm copies take now (None: no cap)."""
    free = [
        _open_slots(i, model, policy)
        for i in snap.instances
        if i.available(snap.now) and _serves_warm(i, model)
    ]
    if not free or None in free:
        return None
    return sum(f for f in free if f is not None)


def _open_slots(instance: InstanceView, model: str, policy: Policy) -> int | None:
    """How many more requests for ``model``, warm on ``instance``, it takes now (None: no
    cap): below the model's ``max_concurrency`` and the limit the instance showed (a 429)."""
    view = instance.models[model]
    limits = [n for n in (policy.slots(model), view.limit) if n is not None]
    return max(0, min(limits) - view.inflight) if limits else None


def _swap_target(
    model: str, candidates: list[InstanceView], snap: Snapshot, policy: Policy
) -> Swap | None:
    """Where to swap ``model`` in: by expected time to its first byte, a copy asleep (its
    measured wake) before a cold one (its measured load) when that is sooner."""
    idle = [
        i
        for i in candidates
        if i.swapping is None and not i.evicting and i.reserved_for in (None, model)
    ]
    asleep = [i for i in idle if i.state_of(model) is WarmState.ASLEEP]
    cold = _target_among(model, [i for i in idle if i not in asleep], snap, policy)
    wake = _target_among(model, asleep, snap, policy, policy.wake)
    if wake is None:
        return cold
    if cold is None or policy.wake(wake.instance, model) <= policy.eta(cold.instance, model):
        return wake
    return cold


def _target_among(
    model: str,
    idle: list[InstanceView],
    snap: Snapshot,
    policy: Policy,
    eta: Callable[[str, str], float] | None = None,
) -> Swap | None:
    """Among ``idle``: one with room first, the soonest (``eta``) or least loaded; else the
    one whose victims cost least."""
    free = [i for i in idle if i.resident < i.capacity and i.fits(model)]
    if free:
        soonest = (lambda i: (eta(i.name, model), i.load)) if eta else _load
        return Swap(min(free, key=soonest).name)
    waited = snap.now - snap.queued.get(model, snap.now)
    bar = LIKELY_BACK + (1 - LIKELY_BACK) * min(1.0, waited / policy.patience(model))
    cheapest = _cheapest_room(model, idle, snap, policy, _Room(bar=bar))
    return Swap(cheapest[0].name, cheapest[1]) if cheapest else None


def _queued_earlier(
    model: str, instance: str, snap: Snapshot, policy: Policy, priority: int = 0
) -> bool:
    """Whether another model, not warm or loading anywhere, whose queued requests are of a
    higher class than ``model``'s, or of the same class and queued since before its oldest,
    would take its swap on ``instance``: then that one goes first."""
    mine = (max(priority, snap.classes.get(model, priority)), -snap.queued.get(model, snap.now))
    for other, since in snap.queued.items():
        theirs = (snap.classes.get(other, 0), -since)
        if other == model or theirs <= mine or _warm_or_loading(other, snap):
            continue
        candidates = [i for i in snap.instances if _loads(i, other, snap.now)]
        target = _swap_target(other, candidates, snap, policy)
        if target is not None and target.instance == instance:
            return True
    return False


def _loads(instance: InstanceView, model: str, now: float) -> bool:
    """Whether a load of ``model`` may start on ``instance`` (as far as its health says)."""
    return (
        model in instance.serves
        and instance.available(now)
        and instance.reachable(model)
        and not instance.backing_off(model, now)
    )


def _backing_off(model: str, snap: Snapshot) -> bool:
    """Whether an instance serving ``model`` is out only because a load failed on it."""
    return any(
        model in i.serves
        and i.up
        and not i.drained
        and i.reachable(model)
        and (snap.now < i.backoff_until or i.backing_off(model, snap.now))
        for i in snap.instances
    )


def _warm_or_loading(model: str, snap: Snapshot) -> bool:
    return any(i.state_of(model) in AWAKE for i in snap.instances)


def starvation_target(
    model: str, snap: Snapshot, policy: Policy, outranks: int | None = None
) -> Swap | None:
    """Where to make room for ``model`` by closing models that still serve: the instance whose
    unpinned victims cost least, counting their in-flight requests as drainable. With
    ``outranks`` (a request's class): only models whose requests, in flight and queued, are all
    of a lower class, and have not waited past their own starvation point."""
    idle = [
        i
        for i in snap.instances
        if _loads(i, model, snap.now) and i.swapping is None and i.reserved_for in (None, model)
    ]
    room = _Room(draining=True, outranks=outranks)
    cheapest = _cheapest_room(model, idle, snap, policy, room)
    return Swap(cheapest[0].name, cheapest[1]) if cheapest else None


@dataclass(frozen=True, slots=True)
class _Room:
    """What may make room. ``draining``: for a request that waited too long (the starvation
    rule) or outranks (a class) the requests in its way, busy models too, once drained.
    Otherwise only models that are done and, under ``demand``, whose chance of being back
    within the horizon is below ``bar``."""

    draining: bool = False
    bar: float = LIKELY_BACK
    outranks: int | None = None


def _cheapest_room(
    model: str, instances: list[InstanceView], snap: Snapshot, policy: Policy, room: _Room
) -> tuple[InstanceView, tuple[str, ...]] | None:
    """The instance whose victims cost least, and those victims."""
    options = [
        (i, victims)
        for i in instances
        if (victims := _victims(model, i, snap, policy, room)) is not None
    ]
    if not options:
        return None
    return min(options, key=lambda o: _room_cost(o[0], o[1], snap, policy))


def _victims(
    model: str, instance: InstanceView, snap: Snapshot, policy: Policy, room: _Room
) -> tuple[str, ...] | None:
    """The cheapest set of evictable models whose eviction makes room for ``model``: one
    place more (``capacity``) and enough bytes (``memory``); None if no set does."""
    count = max(0, instance.resident - instance.capacity + 1)  # none where a place is free
    evictable = sorted(
        (n for n in instance.models if _evictable(instance, n, snap, policy, room)),
        key=lambda name: _victim_cost(instance, name, snap, policy),
    )
    if instance.memory is None:  # by count alone: the cheapest ``count`` of them
        return tuple(evictable[:count]) if len(evictable) >= count else None
    memory = instance.used + instance.sizes.get(model, 0) - instance.memory

    def enough(victims: tuple[str, ...]) -> bool:
        freed = sum(instance.sizes.get(v, 0) for v in victims)
        return len(victims) >= count and freed >= memory

    def cost(victims: tuple[str, ...]) -> tuple[float, float, int]:
        costs = [_victim_cost(instance, v, snap, policy) for v in victims]
        return (sum(c[0] for c in costs), max((c[1] for c in costs), default=0.0), len(victims))

    if len(evictable) > EXACT_SETS:  # greedy, cheapest first, past what is quick to search
        taken = next(
            (evictable[:k] for k in range(len(evictable) + 1) if enough(tuple(evictable[:k]))), None
        )
        return tuple(taken) if taken is not None else None
    sets = (c for k in range(len(evictable) + 1) for c in combinations(evictable, k) if enough(c))
    return min(sets, key=cost, default=None)


def _evictable(
    instance: InstanceView, name: str, snap: Snapshot, policy: Policy, room: _Room
) -> bool:
    m = instance.models[name]
    if m.state is not WarmState.WARM or m.pinned_until > snap.now:
        return False
    if room.outranks is not None and not _below(name, m.top_class, room.outranks, snap, policy):
        return False
    if room.draining:
        # In-flight requests finish first; residency yields to a starving request. A model just
        # loaded for requests that still wait for it serves them first.
        return m.waiting <= m.for_slot
    if m.inflight or m.waiting:
        return False
    if m.closing or m.unwanted or name in snap.unheld:
        return True
    if policy.eviction == "demand":  # kept while it is likely back soon and warm nowhere else
        return _chance(instance, name, snap, policy) < room.bar or _elsewhere(instance, name, snap)
    return m.last_used == 0 or snap.now - m.last_used >= policy.residency(instance.name, name)


def _below(model: str, top: int | None, priority: int, snap: Snapshot, policy: Policy) -> bool:
    """Whether ``model`` is in use (``top``: its highest class in flight; its queue) by
    requests of classes below ``priority`` only, none of them queued past its starvation point.
    A model nobody uses now keeps its residency: outranking closes what others use."""
    queued = snap.classes.get(model)
    if top is None and queued is None:
        return False
    if (top is not None and top >= priority) or (queued is not None and queued >= priority):
        return False
    return queued is None or snap.now - snap.queued[model] < policy.patience(model)


def overflow(instance: InstanceView, snap: Snapshot, policy: Policy) -> tuple[str, ...]:
    """The warm models beyond ``instance``'s capacity, least wanted first: those to put back to
    sleep where the engine keeps every copy awake until told (vLLM's servers start awake, come
    back awake after a restart, and wake when anyone asks). Residency does not protect them
    (the capacity is broken now); pinned and busy ones stay, and what stays over waits for
    them to be done."""
    excess = instance.resident - instance.capacity
    if excess <= 0 or instance.swapping is not None:
        return ()
    idle = [
        name
        for name, m in instance.models.items()
        if m.state is WarmState.WARM
        and m.pinned_until <= snap.now
        and not (m.inflight or m.waiting)
    ]
    idle.sort(key=lambda name: _victim_cost(instance, name, snap, policy))
    return tuple(idle[:excess])


def _chance(instance: InstanceView, model: str, snap: Snapshot, policy: Policy) -> float:
    """The chance that ``model`` is requested again within the horizon (its swap times on
    ``instance``); nothing for a model no request asked for yet."""
    arrivals = snap.arrivals.get(model)
    if arrivals is None:
        return 0.0
    return arrivals.chance_within(snap.now, policy.horizon * policy.eta(instance.name, model))


def _victim_cost(
    instance: InstanceView, name: str, snap: Snapshot, policy: Policy
) -> tuple[float, float]:
    """Sort key of a victim: (expected cost of its return, last use) — last use alone for LRU.
    The expected cost is the chance of its next request within the horizon × its measured swap
    time; none while another instance has it warm to serve them."""
    m = instance.models[name]
    if m.unwanted:
        return (-1.0, 0.0)
    if policy.eviction == "lru" or _elsewhere(instance, name, snap):
        return (0.0, m.last_used)
    return (_chance(instance, name, snap, policy) * policy.eta(instance.name, name), m.last_used)


def _elsewhere(instance: InstanceView, model: str, snap: Snapshot) -> bool:
    """Whether another available instance has ``model`` warm to serve its requests."""
    return any(
        i.name != instance.name and i.available(snap.now) and _serves_warm(i, model)
        for i in snap.instances
    )


def _serves_warm(instance: InstanceView, model: str) -> bool:
    view = instance.models.get(model)
    return view is not None and view.state is WarmState.WARM and not view.closing


def _room_cost(
    instance: InstanceView, victims: tuple[str, ...], snap: Snapshot, policy: Policy
) -> tuple[float, float]:
    """What making room on ``instance`` costs: its victims' summed cost, then the latest use
    among them. No victims (room already free there, as the starvation rule may find): none."""
    costs = [_victim_cost(instance, v, snap, policy) for v in victims]
    return (sum(c[0] for c in costs), max((c[1] for c in costs), default=0.0))


def frees_up_at(
    instance: InstanceView, now: float, policy: Policy, unheld: frozenset[str] = frozenset()
) -> float:
    """When the instance can next take a swap: its running swap's end, else the earliest
    residency expiry among its warm models (in-flight and pins only make it later; a model
    nobody wanted has none)."""
    if instance.swapping is not None:
        return instance.swap_done_by
    expiries = [
        max(_residency_ends(instance, name, now, policy, unheld), m.pinned_until)
        for name, m in instance.models.items()
        if m.state is WarmState.WARM
    ]
    return min(expiries, default=now)


def _residency_ends(
    instance: InstanceView, name: str, now: float, policy: Policy, unheld: frozenset[str]
) -> float:
    m = instance.models[name]
    if m.unwanted or name in unheld:
        return now
    return m.last_used + policy.residency(instance.name, name)


def _room_for(instance: InstanceView, model: str) -> bool:
    """Whether ``model`` could fit ``instance`` at all, were everything else evicted."""
    return instance.memory is None or instance.sizes.get(model, 0) <= instance.memory


def _load(instance: InstanceView) -> float:
    return instance.load


def _why_unavailable(model: str, snap: Snapshot) -> tuple[str, bool]:
    """Why no instance can take ``model``, and whether that lasts until the config changes."""
    serving = [i for i in snap.instances if model in i.serves]
    if not serving:
        return f"no instance serves {model!r}", True
    if not any(_room_for(i, model) for i in serving):
        limits = ", ".join(f"{i.name} {human(i.memory or 0)}" for i in serving)
        return (
            f"{model!r} is larger than the memory of every instance serving it ({limits}); "
            "the operator should give it an instance with more memory or a smaller file "
            "(swapgate plan shows the sizes)",
            True,
        )
    states = "; ".join(f"{i.name} {_condition(i, model, snap.now)}" for i in serving)
    return f"no instance can serve {model!r} right now ({states})", False


def _condition(instance: InstanceView, model: str, now: float) -> str:
    view = instance.models.get(model)
    if not instance.up:
        return "is down"
    if instance.drained:
        return "is drained"
    if view is not None and view.down:
        return f"cannot reach {model!r}: {view.down}"
    if now < instance.backoff_until:
        return (
            f"backs off after failed loads of two or more of its models for "
            f"{instance.backoff_until - now:.0f}s more"
        )
    if view is not None and now < view.backoff_until:
        why = f": {view.failure}" if view.failure else ""
        return (
            f"backs off loading {model!r} for {view.backoff_until - now:.0f}s more after a "
            f"failed swap{why}"
        )
    return "is busy"
