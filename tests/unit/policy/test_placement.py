"""Placement rules as a table: each case is a registry snapshot and the decision it must give."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from swapgate.data.demand import Arrivals
from swapgate.data.snapshot import InstanceView, ModelView, Snapshot
from swapgate.data.warm import WarmState
from swapgate.policy.placement import (
    Full,
    Join,
    Policy,
    Queue,
    Serve,
    Swap,
    Unavailable,
    overflow,
    place,
)

NOW = 1000.0
POLICY = Policy(min_residency=30.0)
W, L, C = WarmState.WARM, WarmState.LOADING, WarmState.COLD


@dataclass
class I:  # noqa: E742 - one letter keeps the table readable
    name: str
    models: dict[str, tuple[WarmState, float, int, float] | ModelView] = field(default_factory=dict)
    serves: tuple[str, ...] = ("a", "b", "c")
    up: bool = True
    drained: bool = False
    capacity: int = 1
    weight: float = 1.0
    inflight: int = 0
    swapping: str | None = None
    swap_done_by: float = 0.0
    backoff_until: float = 0.0
    reserved_for: str | None = None
    memory: int | None = None
    sizes: dict[str, int] = field(default_factory=dict)

    def view(self) -> InstanceView:
        models = {
            name: spec if isinstance(spec, ModelView) else ModelView(spec[0], 0.0, *spec[1:])
            for name, spec in self.models.items()
        }
        return InstanceView(
            self.name,
            self.up,
            self.drained,
            self.capacity,
            self.weight,
            self.inflight,
            frozenset(self.serves),
            models,
            self.swapping,
            self.swap_done_by,
            self.backoff_until,
            self.reserved_for,
            self.memory,
            self.sizes,
        )


def warm(
    used: float = 0.0, inflight: int = 0, pinned_until: float = 0.0
) -> tuple[WarmState, float, int, float]:
    return (W, used, inflight, pinned_until)


def model(
    used: float = 0.0, inflight: int = 0, pinned_until: float = 0.0, **more: Any
) -> ModelView:
    return ModelView(W, 0.0, used, inflight, pinned_until, **more)


def snap(
    *instances: I,
    arrivals: dict[str, Arrivals] | None = None,
    queued: dict[str, float] | None = None,
) -> Snapshot:
    """``arrivals``: each model's requests so far; ``queued``: when each model's oldest queued
    request arrived."""
    return Snapshot(NOW, tuple(i.view() for i in instances), arrivals or {}, queued or {})


CASES = [
    ("warm wins over free capacity", [I("x"), I("y", {"a": warm()})], Serve("y")),
    (
        "among warm, fewest in flight per weight",
        [I("x", {"a": warm()}, inflight=3), I("y", {"a": warm()}, inflight=2)],
        Serve("y"),
    ),
    (
        "weight divides the load",
        [I("x", {"a": warm()}, inflight=3, weight=4), I("y", {"a": warm()}, inflight=1)],
        Serve("x"),
    ),
    ("loading: join the swap", [I("x", {"a": (L, 0, 0, 0)}, swapping="a"), I("y")], Join("x")),
    (
        "join the swap expected to end first",
        [
            I("x", {"a": (L, 0, 0, 0)}, swapping="a", swap_done_by=NOW + 20),
            I("y", {"a": (L, 0, 0, 0)}, swapping="a", swap_done_by=NOW + 5),
        ],
        Join("y"),
    ),
    ("cold: free capacity first", [I("x", {"b": warm()}), I("y")], Swap("y")),
    (
        "free capacity: least loaded",
        [I("x", capacity=2, inflight=2, models={"b": warm()}), I("y", capacity=2, inflight=0)],
        Swap("y"),
    ),
    (
        "full: evict the least recently used victim",
        [I("x", {"b": warm(used=900)}), I("y", {"c": warm(used=800)})],
        Swap("y", ("c",)),
    ),
    (
        "never evict a model with requests in flight",
        [I("x", {"b": warm(used=500, inflight=1)}), I("y", {"c": warm(used=900)})],
        Swap("y", ("c",)),
    ),
    (
        "never evict inside min_residency",
        [I("x", {"b": warm(used=NOW - 10)}), I("y", {"c": warm(used=NOW - 31)})],
        Swap("y", ("c",)),
    ),
    (
        "never evict a pinned model",
        [I("x", {"b": warm(pinned_until=NOW + 60)}), I("y", {"c": warm(used=900)})],
        Swap("y", ("c",)),
    ),
    (
        "an expired pin is evictable",
        [I("x", {"b": warm(pinned_until=NOW - 1)})],
        Swap("x", ("b",)),
    ),
    (
        "a model never used through swapgate is evictable at once",
        [I("x", {"b": warm(used=0.0)})],
        Swap("x", ("b",)),
    ),
    (
        "capacity 2 full: one victim, the older",
        [I("x", {"b": warm(used=700), "c": warm(used=600)}, capacity=2)],
        Swap("x", ("c",)),
    ),
    (
        "nothing evictable: queue where it frees up first",
        [
            I("x", {"b": warm(used=NOW - 1)}),
            I("y", {"c": warm(used=NOW - 25)}),
        ],
        Queue("y"),
    ),
    (
        "an instance swapping something else takes no second swap",
        [I("x", {"b": (L, 0, 0, 0)}, swapping="b", swap_done_by=NOW + 3, capacity=2)],
        Queue("x"),
    ),
    (
        "down, drained and backing-off instances are not candidates",
        [
            I("x", up=False),
            I("y", drained=True),
            I("z", backoff_until=NOW + 5),
            I("w", {"a": warm()}, serves=("b",)),
        ],
        Unavailable(
            "no instance can serve 'a' right now "
            "(x is down; y is drained; z backs off after failed loads of two or more of its "
            "models for 5s more)",
            backing_off=True,
        ),
    ),
    ("backoff over: a candidate again", [I("z", backoff_until=NOW - 1)], Swap("z")),
    (
        "grouping: a model its waiters have not reached yet is no victim",
        [I("x", {"b": model(used=500, waiting=2)}), I("y", {"c": model(used=900)})],
        Swap("y", ("c",)),
    ),
    (
        "grouping: with every victim awaited, queue",
        [I("x", {"b": model(used=500, waiting=1)})],
        Queue("x"),
    ),
    (
        "a closing model takes no new requests",
        [I("x", {"a": model(closing=True)}), I("y", {"a": model()})],
        Serve("y"),
    ),
    (
        "a closing model, once drained, is evictable inside min_residency",
        [I("x", {"b": model(used=NOW - 1, closing=True)})],
        Swap("x", ("b",)),
    ),
    (
        "a closing model with requests in flight is not evicted yet",
        [I("x", {"b": model(used=NOW - 1, closing=True, inflight=1)})],
        Queue("x"),
    ),
    (
        "no instance serves it",
        [I("x", serves=("b",))],
        Unavailable("no instance serves 'a'", lasting=True),
    ),
]


@pytest.mark.parametrize(("why", "instances", "decision"), CASES, ids=[c[0] for c in CASES])
def test_place(why: str, instances: list[I], decision: object) -> None:
    assert place("a", snap(*instances), POLICY) == decision


SWAP_SECONDS = {"x": 10.0, "y": 60.0}  # horizons: 30 s on x, 180 s on y, 90 s elsewhere
DEMAND = Policy(30.0, "demand", lambda instance, _: SWAP_SECONDS.get(instance, 30.0), horizon=3)


def steady(every: float, idle: float) -> Arrivals:
    """A model requested every ``every`` seconds, last ``idle`` seconds ago."""
    return Arrivals(NOW - idle, (every,) * 20)


def done(idle: float) -> Arrivals:
    """A model whose burst ended ``idle`` seconds ago; bursts come every 10 minutes."""
    return Arrivals(NOW - idle, (1.0,) * 20 + (600.0,) * 3)


@pytest.mark.parametrize(
    ("why", "instances", "arrivals", "lru_decision", "demand_decision"),
    [
        (
            "demand keeps the model likely back although it was used longer ago",
            [I("x", {"b": model(used=500), "c": model(used=900)}, capacity=2)],
            {"b": steady(10, idle=5), "c": done(idle=100)},
            Swap("x", ("b",)),
            Swap("x", ("c",)),
        ),
        (
            "demand weighs the swap time: a model slow to load stays",
            [I("x", {"b": model(used=500)}), I("y", {"c": model(used=400)})],
            {"b": done(idle=500), "c": done(idle=400)},  # b: 10 s × 0.04, c: 60 s × 0.08
            Swap("y", ("c",)),
            Swap("x", ("b",)),
        ),
        (
            "equal cost: demand falls back to the least recently used",
            [I("x", {"b": model(used=500)}), I("y", {"c": model(used=400)})],
            {},
            Swap("y", ("c",)),
            Swap("y", ("c",)),
        ),
        (
            "a model warm on another instance too costs nothing to evict here",
            [
                I("x", {"b": model(used=400)}),
                I("y", {"c": model(used=500)}),
                I("z", {"c": model(used=NOW - 1)}),
            ],
            {"b": done(idle=600), "c": steady(5, idle=1)},
            Swap("x", ("b",)),
            Swap("y", ("c",)),
        ),
        (
            "demand: a model whose burst is over makes room inside min_residency",
            [I("x", {"b": model(used=NOW - 20)})],
            {"b": done(idle=20)},
            Queue("x"),
            Swap("x", ("b",)),
        ),
        (
            "demand: a model likely back stays after min_residency",
            [I("x", {"b": model(used=NOW - 35)})],
            {"b": steady(40, idle=35)},
            Swap("x", ("b",)),
            Queue("x"),
        ),
        (
            "demand: a model asked for once stays while idle shorter than the horizon",
            [I("y", {"b": model(used=NOW - 40)})],
            {"b": Arrivals(NOW - 40)},  # 180 s horizon on y: a chance of 180 / 220
            Swap("y", ("b",)),
            Queue("y"),
        ),
        (
            "demand: a model no request asked for is free to evict",
            [I("x", {"b": model(used=0.0)})],
            {},
            Swap("x", ("b",)),
            Swap("x", ("b",)),
        ),
        (
            "demand: a model with a request in flight stays",
            [I("x", {"b": model(used=NOW - 20, inflight=1)})],
            {"b": done(idle=20)},
            Queue("x"),
            Queue("x"),
        ),
        (
            "demand: a pinned model stays",
            [I("x", {"b": model(used=NOW - 500, pinned_until=NOW + 60)})],
            {"b": done(idle=500)},
            Queue("x"),
            Queue("x"),
        ),
        (
            "a copy on a drained instance does not count as warm elsewhere",
            [
                I("x", {"b": model(used=400)}),
                I("y", {"c": model(used=500)}),
                I("z", {"c": model(used=NOW - 1)}, drained=True),
            ],
            {"b": done(idle=600), "c": steady(5, idle=1)},
            Swap("x", ("b",)),
            Swap("x", ("b",)),
        ),
        (
            "a copy that is closing does not count as warm elsewhere",
            [
                I("x", {"b": model(used=400)}),
                I("y", {"c": model(used=500)}),
                I("z", {"c": model(used=NOW - 1, closing=True, inflight=1)}),
            ],
            {"b": done(idle=600), "c": steady(5, idle=1)},
            Swap("x", ("b",)),
            Swap("x", ("b",)),
        ),
    ],
)
def test_eviction_policies(
    why: str,
    instances: list[I],
    arrivals: dict[str, Arrivals],
    lru_decision: object,
    demand_decision: object,
) -> None:
    assert place("a", snap(*instances, arrivals=arrivals), POLICY) == lru_decision
    assert place("a", snap(*instances, arrivals=arrivals), DEMAND) == demand_decision


def test_the_starvation_target_drains_the_cheapest_unpinned_victim() -> None:
    from swapgate.policy.placement import starvation_target

    busy = [
        I("x", {"b": model(used=NOW - 1, inflight=3)}),
        I("y", {"c": model(used=NOW - 1, inflight=1)}),
        I("z", {"d": model(used=0.0, pinned_until=NOW + 60)}),
    ]
    arrivals = {"b": steady(1, idle=0), "c": Arrivals(NOW - 1, (3600.0,) * 10)}
    assert place("a", snap(*busy, arrivals=arrivals), DEMAND) == Queue("x")
    # b, requested every second, costs 1 × 10 s; c, about hourly, 0.09 × 60 s = 5.4: drain c
    assert starvation_target("a", snap(*busy, arrivals=arrivals), DEMAND) == Swap("y", ("c",))
    # an instance whose room is already reserved for another starving model is not drained again
    busy[1].reserved_for = "e"
    assert starvation_target("a", snap(*busy, arrivals=arrivals), DEMAND) == Swap("x", ("b",))
    only_pinned = [I("z", {"d": model(pinned_until=NOW + 60)})]
    assert starvation_target("a", snap(*only_pinned), DEMAND) is None


def test_under_demand_the_longer_a_request_queued_the_likelier_back_its_victim_may_be() -> None:
    patient = replace(DEMAND, patience=lambda _: 30.0)
    one = [I("x", {"b": model(used=NOW - 10)})]
    # idle 10 s: of b's four gaps, two ended within 10 + 30 s; with the assumed one, 0.55
    arrivals = {"b": Arrivals(NOW - 10, (20.0, 20.0, 100.0, 100.0))}
    assert place("a", snap(*one, arrivals=arrivals), patient) == Queue("x")
    queued_2s = snap(*one, arrivals=arrivals, queued={"a": NOW - 2})  # bar 0.53
    assert place("a", queued_2s, patient) == Queue("x")
    queued_10s = snap(*one, arrivals=arrivals, queued={"a": NOW - 10})  # bar 0.67
    assert place("a", queued_10s, patient) == Swap("x", ("b",))
    # at the starvation point any model that is done may go; one in flight or pinned still not
    busy = [I("x", {"b": model(used=NOW, inflight=1)})]
    pinned = [I("x", {"b": model(used=NOW - 10, pinned_until=NOW + 60)})]
    for instances in (busy, pinned):
        waited = snap(*instances, arrivals=arrivals, queued={"a": NOW - 60})
        assert place("a", waited, patient) == Queue("x")


QUEUE_CASES = [
    (
        "a model queued earlier takes the only swap target first",
        [I("x", {"c": model(used=500)})],
        {"b": NOW - 20, "a": NOW - 5},
        Queue("x"),
    ),
    (
        "the oldest queued model goes first: a fresh request queues behind it",
        [I("x", {"c": model(used=500)})],
        {"b": NOW - 20},
        Queue("x"),
    ),
    (
        "a model queued later does not hold this one back",
        [I("x", {"c": model(used=500)})],
        {"b": NOW - 5, "a": NOW - 20},
        Swap("x", ("c",)),
    ),
    (
        "an earlier model that would swap elsewhere does not hold this one back",
        [I("x", {"c": model(used=500)}), I("y", {"d": model(used=400)}, serves=("b", "d"))],
        {"b": NOW - 20},
        Swap("x", ("c",)),
    ),
    (
        "an earlier model already loading is no rival",
        [I("x", {"c": model(used=500)}), I("y", {"b": (L, 0, 0, 0)}, swapping="b")],
        {"b": NOW - 20},
        Swap("x", ("c",)),
    ),
    (
        "room reserved for a starving model goes to no other",
        [I("x", {"c": model(used=500)}, reserved_for="b")],
        {},
        Queue("x"),
    ),
    (
        "room reserved for this model is its to take",
        [I("x", {"c": model(used=NOW - 1, closing=True)}, reserved_for="a")],
        {"b": NOW - 20},
        Swap("x", ("c",)),
    ),
]


@pytest.mark.parametrize(
    ("why", "instances", "queued", "decision"), QUEUE_CASES, ids=[c[0] for c in QUEUE_CASES]
)
def test_first_come_first_swapped(
    why: str, instances: list[I], queued: dict[str, float], decision: object
) -> None:
    assert place("a", snap(*instances, queued=queued), POLICY) == decision


# -- memory (docs/memory.md): sizes in GiB for reading; a 24 GiB card of capacity 3 ----------------

G = 2**30
SIZES = {"a": 10 * G, "b": 10 * G, "c": 20 * G, "d": 4 * G, "e": 8 * G, "huge": 30 * G}


def card(**models: tuple[WarmState, float, int, float]) -> I:
    return I(
        "gpu",
        dict(models),
        ("a", "b", "c", "d", "e", "huge"),
        capacity=3,
        memory=24 * G,
        sizes=SIZES,
    )


@pytest.mark.parametrize(
    ("instances", "model", "decision"),
    [
        # two small ones fit together: the second needs no victim
        ((card(a=warm(900)),), "b", Swap("gpu")),
        # the big one needs the room of both small ones: one swap evicts the two
        ((card(a=warm(900), b=warm(950)),), "c", Swap("gpu", ("a", "b"))),
        # one small one suffices for another small one: the least recently used goes
        ((card(a=warm(900), c=warm(800)),), "b", Swap("gpu", ("c",))),
        # the cheapest set, not the cheapest first: a alone frees 10, b+d frees 14 < 20 needed
        ((card(a=warm(800), d=warm(900)),), "c", Swap("gpu", ("a",))),
        # 8 GiB must go: the oldest (d, 4 GiB) alone is not enough, and one by one would take d
        # and a; the cheapest set is a alone
        ((card(d=warm(800), a=warm(900), e=warm(950)),), "b", Swap("gpu", ("a",))),
        # a small one in flight cannot go, and the other alone makes too little room: queue
        ((card(a=warm(900, inflight=1), b=warm(950)),), "c", Queue("gpu")),
        # pinned counts the same
        ((card(a=warm(900, pinned_until=NOW + 60), b=warm(950)),), "c", Queue("gpu")),
        # a model larger than the instance can never go there
        (
            (card(),),
            "huge",
            Unavailable(
                "'huge' is larger than the memory of every instance serving it (gpu 24 GiB); "
                "the operator should give it an instance with more memory or a smaller file "
                "(swapgate plan shows the sizes)",
                lasting=True,
            ),
        ),
        # with two instances, the one where it fits without evicting anything
        ((card(c=warm(900)), replace(card(), name="gpu-2")), "a", Swap("gpu-2")),
        # capacity holds too: three 4 GiB models leave room in bytes but not in places
        (
            (replace(card(), capacity=2, models={"d": warm(900), "a": warm(950)}),),
            "b",
            Swap("gpu", ("d",)),
        ),
    ],
)
def test_memory_placement(instances: tuple[I, ...], model: str, decision: object) -> None:
    assert place(model, snap(*instances), POLICY) == decision


# -- warmth tiers (docs/configuration.md vllm-sleep): warm < asleep (its wake) < cold (its load) ---

A = WarmState.ASLEEP
TIERS = Policy(min_residency=0.0, eta=lambda i, m: 20.0, wake=lambda i, m: {"x": 1.0}.get(i, 3.0))


def asleep() -> tuple[WarmState, float, int, float]:
    return (A, 0.0, 0, 0.0)


@pytest.mark.parametrize(
    ("instances", "decision"),
    [
        # a warm copy, even busy, before waking one
        ((I("x", {"a": asleep()}), I("y", {"a": warm()}, inflight=5)), Serve("y")),
        # asleep (a 1 s wake) before cold (a 20 s load), though the cold one is free too
        ((I("cold"), I("x", {"a": asleep()})), Swap("x")),
        # the one whose wake is sooner
        ((I("y", {"a": asleep()}), I("x", {"a": asleep()})), Swap("x")),
        # an asleep copy whose GPU is taken wakes after putting the awake model to sleep
        ((I("x", {"a": asleep(), "b": warm(900)}),), Swap("x", ("b",))),
        # ... unless that one is busy: a cold copy elsewhere is then the way
        ((I("x", {"a": asleep(), "b": warm(900, inflight=1)}), I("cold")), Swap("cold")),
        # an asleep copy takes no place: capacity 1 with b asleep beside it is free for a
        ((I("x", {"b": asleep()}),), Swap("x")),
    ],
)
def test_placement_goes_to_the_copy_ready_soonest(
    instances: tuple[I, ...], decision: object
) -> None:
    assert place("a", snap(*instances), TIERS) == decision


def test_a_cold_copy_wins_when_its_load_is_sooner_than_the_wake() -> None:
    slow_wake = replace(TIERS, wake=lambda i, m: 60.0)
    assert place("a", snap(I("x", {"a": asleep()}), I("cold")), slow_wake) == Swap("cold")


# -- over capacity: what a vLLM instance finds awake beyond its places (started, woken by hand) ---


@pytest.mark.parametrize(
    ("instance", "extra"),
    [
        # both found awake at start (never used): the one listed first goes back to sleep
        (I("x", {"a": warm(), "b": warm()}), ("a",)),
        # the least recently used goes, residency or not (the capacity is broken now)
        (I("x", {"a": warm(995), "b": warm(999)}), ("a",)),
        (I("x", {"a": warm(999), "b": warm(995)}), ("b",)),
        # pinned and busy ones stay; what is over waits for them
        (I("x", {"a": warm(pinned_until=2000), "b": warm(999)}), ("b",)),
        (I("x", {"a": warm(inflight=1), "b": warm(inflight=2)}), ()),
        (I("x", {"a": model(waiting=1), "b": warm(999)}), ("b",)),
        # two places: three awake is one too many; asleep ones take none
        (I("x", {"a": warm(1), "b": warm(2), "c": warm(3)}, capacity=2), ("a",)),
        (I("x", {"a": warm(), "b": asleep()}), ()),
        # a swap running there decides for itself
        (I("x", {"a": warm(), "b": warm()}, swapping="c"), ()),
    ],
)
def test_what_is_awake_beyond_capacity_goes_back_to_sleep_least_wanted_first(
    instance: I, extra: tuple[str, ...]
) -> None:
    view = snap(instance)
    assert overflow(view.instances[0], view, POLICY) == extra


# -- priority classes and per-model concurrency (docs/keys.md) -------------------------------------

INTERACTIVE, BATCH = 10, -10
SLOTS_2 = replace(POLICY, slots=lambda model: 2 if model == "a" else None)


def test_a_model_whose_every_slot_is_taken_waits_for_one_instead_of_reaching_the_engine() -> None:
    from swapgate.policy.placement import Full, free_slots

    two = snap(I("x", {"a": warm(990, inflight=2)}), I("y", {"a": warm(990, inflight=1)}))
    assert place("a", two, SLOTS_2) == Serve("y")
    assert free_slots("a", two, SLOTS_2) == 1
    full = snap(I("x", {"a": warm(990, inflight=2)}), I("y", {"a": warm(990, inflight=3)}))
    assert place("a", full, SLOTS_2) == Full("x"), "the one nearest a free slot"
    assert free_slots("a", full, SLOTS_2) == 0
    assert free_slots("b", full, SLOTS_2) is None, "no cap"
    assert place("b", snap(I("x", {"b": warm(990, inflight=50)})), SLOTS_2) == Serve("x")


def test_a_higher_class_goes_first_for_a_swap_and_within_a_class_the_earliest() -> None:
    # a and b are both cold; x has room for one of them once c's residency ends
    instances = (I("x", {"c": warm(900)}),)
    b_first = snap(*instances, queued={"a": NOW - 1, "b": NOW - 5})
    assert place("a", b_first, POLICY) == Queue("x"), "b queued earlier, same class"
    a_higher = replace(b_first, classes={"a": INTERACTIVE, "b": 0})
    assert place("a", a_higher, POLICY) == Swap("x", ("c",))
    assert place("b", a_higher, POLICY) == Queue("x"), "b's older wait yields to a's class"
    # a request's own class counts before its model has queued
    only_b = snap(*instances, queued={"b": NOW - 5})
    assert place("a", only_b, POLICY, INTERACTIVE) == Swap("x", ("c",))
    assert place("a", only_b, POLICY, BATCH) == Queue("x")


def test_a_higher_class_closes_only_what_lower_classes_alone_use() -> None:
    from swapgate.policy.placement import starvation_target

    patient = replace(POLICY, patience=lambda model: 20.0)

    def busy(top: int | None, **queue: Any) -> Snapshot:
        used = model(999, inflight=1 if top is not None else 0, top_class=top)
        return snap(I("x", {"b": used}), **queue)

    assert starvation_target("a", busy(BATCH), patient, INTERACTIVE) == Swap("x", ("b",))
    assert starvation_target("a", busy(INTERACTIVE), patient, INTERACTIVE) is None, "its equal"
    assert starvation_target("a", busy(None), patient, INTERACTIVE) is None, "idle: residency"
    waiting = busy(BATCH, queued={"b": NOW - 5})
    lower_queue = replace(waiting, classes={"b": BATCH})
    assert starvation_target("a", lower_queue, patient, INTERACTIVE) == Swap("x", ("b",))
    higher_queue = replace(waiting, classes={"b": INTERACTIVE})
    assert starvation_target("a", higher_queue, patient, INTERACTIVE) is None
    starving = replace(busy(BATCH, queued={"b": NOW - 25}), classes={"b": BATCH})
    assert starvation_target("a", starving, patient, INTERACTIVE) is None, (
        "b's own queue waited past its starvation point: it is served first"
    )
    assert starvation_target("a", busy(INTERACTIVE), patient) == Swap("x", ("b",)), (
        "the starvation rule itself closes any class"
    )


def test_the_starvation_rule_lets_a_model_just_loaded_serve_those_who_waited_for_it() -> None:
    from swapgate.policy.placement import starvation_target

    loaded = snap(I("x", {"b": model(999, waiting=3)}))
    assert starvation_target("a", loaded, POLICY) is None, "its 3 waiters go first"
    slot_queue = snap(I("x", {"b": model(999, inflight=2, waiting=3, for_slot=3)}))
    assert starvation_target("a", slot_queue, POLICY) == Swap("x", ("b",)), (
        "requests queued for a free slot drain like those in flight: the bound holds"
    )


def cold(**more: Any) -> ModelView:
    return ModelView(C, 0.0, 0.0, 0, 0.0, **more)


def test_a_model_backing_off_does_not_load_there_but_its_neighbours_keep_serving() -> None:
    x = I(
        "x",
        {"a": cold(backoff_until=NOW + 5, failure="a exited with SIGSEGV"), "b": warm()},
        capacity=1,
    )
    decision = place("a", snap(x), POLICY)
    assert isinstance(decision, Unavailable)
    assert decision.backing_off
    assert "a exited with SIGSEGV" in decision.reason
    assert "backs off loading 'a' for 5s more" in decision.reason
    assert place("b", snap(x), POLICY) == Serve("x")  # its neighbour: served, not evicted
    assert place("c", snap(x), POLICY) == Swap("x", ("b",))  # others still load there
    assert place("a", snap(x, I("y")), POLICY) == Swap("y")  # elsewhere it loads


def test_a_model_whose_server_is_down_fails_at_once_and_evicts_nothing() -> None:
    why = "its vLLM server 127.0.0.1:8002 does not answer"
    x = I("x", {"a": cold(down=why), "b": warm(used=NOW - 3600)}, capacity=1)
    decision = place("a", snap(x), POLICY)
    assert isinstance(decision, Unavailable)  # not Swap("x", ("b",)): b stays awake
    assert not decision.backing_off
    assert "x cannot reach 'a': its vLLM server 127.0.0.1:8002 does not answer" in decision.reason
    assert place("b", snap(x), POLICY) == Serve("x")


def test_a_model_backing_off_is_not_first_in_line_for_a_swap() -> None:
    # c queued first, but cannot load on x now: b's request takes the swap instead of
    # queueing behind a model that cannot load.
    x = I("x", {"c": cold(backoff_until=NOW + 5)}, capacity=1)
    decision = place("b", snap(x, queued={"c": NOW - 10, "b": NOW}), POLICY)
    assert decision == Swap("x")


def test_a_limit_the_instance_showed_makes_its_warm_copy_full_at_it() -> None:
    # llama-swap answered 429 with one request in flight: it takes one at a time
    x = I("x", {"a": model(inflight=1, limit=1)})
    assert place("a", snap(x), POLICY) == Full("x")
    y = I("y", {"a": model(inflight=1)})
    assert place("a", snap(x, y), POLICY) == Serve("y"), "another warm copy takes it"
    x_free = I("x", {"a": model(inflight=0, limit=1)})
    assert place("a", snap(x_free), POLICY) == Serve("x")


def test_an_instance_with_room_to_spare_costs_nothing_to_make_room_on() -> None:
    """A fleet whose capacity is above one reaches this as soon as it fills: the starvation rule
    weighs an instance that already has a free place. Its victims are none, and it costs
    nothing (a reduction over no victims crashed every request that reached it)."""
    from swapgate.policy.placement import starvation_target

    roomy = [I("x", {"b": model(used=NOW - 1, inflight=1)}, capacity=2)]
    assert starvation_target("a", snap(*roomy), DEMAND) == Swap("x", ())
    busy = I("y", {"c": model(used=NOW - 1, inflight=1)})
    assert starvation_target("a", snap(busy, *roomy), DEMAND) == Swap("x", ())
