"""``Router.place`` looks first among the instances holding a copy of the model (an index, not a
walk of the fleet). Whatever the fleet's state, its decision is the one a walk of every
instance makes: the same instance, and the same kind of decision."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swapgate.control.routing.waiter import Routing
from swapgate.data.warm import InstanceReport, WarmState
from tests.unit.fakes import World, world
from tests.unit.strategies import BOUNDED

NAMES = ("i0", "i1", "i2", "i3")
MODELS = ("a", "b", "c")
CONFIG: dict[str, Any] = {
    "instances": [
        {"name": "i0", "url": "http://i0", "models": ["a", "b", "c"]},
        {"name": "i1", "url": "http://i1", "models": ["a", "b"], "capacity": 2},
        {"name": "i2", "url": "http://i2", "models": ["b", "c"]},
        {"name": "i3", "url": "http://i3", "models": ["a", "c"], "capacity": 2},
    ],
    "routing": {"min_residency": 0},
    "models": {"a": {"max_concurrency": 1}},
}
Op = tuple[str, str, Any]
OPS = st.one_of(
    st.tuples(
        st.just("poll"),
        st.sampled_from(NAMES),
        st.dictionaries(st.sampled_from(MODELS), st.sampled_from(list(WarmState)), max_size=2),
    ),
    st.tuples(st.just("down"), st.sampled_from(NAMES), st.none()),
    st.tuples(st.just("drain"), st.sampled_from(NAMES), st.booleans()),
    st.tuples(st.just("begin"), st.sampled_from(NAMES), st.sampled_from(MODELS)),
    st.tuples(st.just("end"), st.sampled_from(NAMES), st.sampled_from(MODELS)),
    st.tuples(st.just("request"), st.sampled_from(NAMES), st.sampled_from(MODELS)),
    st.tuples(st.just("close"), st.sampled_from(NAMES), st.sampled_from(MODELS)),
)


def apply(w: World, op: Op) -> None:
    kind, name, what = op
    registry = w.registry
    if kind == "poll":
        registry.polls.apply_report(name, InstanceReport(what, None), registry.generation(name))
    elif kind == "down":
        registry.polls.mark_down(name)
    elif kind == "drain":
        registry.operator.set_drained(name, what)
    elif kind == "begin":
        registry.swap_marks.begin_swap(name, what, 5.0)
    elif kind == "end":
        registry.swap_marks.end_swap(name, what, ok=True)
    elif kind == "request":
        registry.traffic.begin_request(name, what)
    else:
        registry.swap_marks.close_for_eviction(name, (what,))


@BOUNDED
@given(st.lists(OPS, max_size=25), st.sampled_from(MODELS), st.integers(0, 2))
def test_placing_from_the_copies_decides_as_a_walk_of_the_fleet(
    ops: list[Op], model: str, priority: int
) -> None:
    w = world(CONFIG)
    for name in NAMES:
        w.warm(name)
    for op in ops:
        apply(w, op)
    routing = Routing(priority=priority)
    now = w.registry.clock()
    looked_up = w.router.place(model, routing, now)
    with pytest.MonkeyPatch.context() as patch:  # every instance a copy: a walk of the fleet
        patch.setattr(w.registry.copies, "of", lambda model: w.registry.names())
        walked = w.router.place(model, routing, now)
    assert looked_up == walked
