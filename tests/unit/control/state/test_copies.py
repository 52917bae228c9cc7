"""The index of copies by model (swapgate/control/state/copies.py) stays equal to a walk of the
whole fleet after any sequence of changes: polls, instances down, swaps begun, ended, failed,
evictions, another replica's warm model, requests, and reloads that keep, replace (a new URL)
or remove instances. A request for a warm model reads it instead of walking the fleet, so a
copy it missed would never be served."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.config.settings import Settings
from swapgate.control.state.registry import Registry
from swapgate.data.warm import InstanceReport, WarmState
from tests.unit.strategies import BOUNDED

NAMES = ("i0", "i1", "i2", "i3")
MODELS = ("a", "b", "c", "d", "e")
STATES = st.sampled_from(list(WarmState))


def settings(names: tuple[str, ...], moved: frozenset[str] = frozenset()) -> Settings:
    """``names`` serving every model; those ``moved`` at another URL (another server)."""
    return parse_config(
        {
            "instances": [
                {"name": n, "url": f"http://{n}{'-moved' if n in moved else ''}", "models": MODELS}
                for n in names
            ]
        }
    )


def walked(registry: Registry) -> dict[str, list[str]]:
    """Each model's copies that are not cold, by walking every instance's view."""
    found: dict[str, list[str]] = {}
    for inst in registry.snapshot().instances:
        for model in inst.models:
            if inst.state_of(model) is not WarmState.COLD:
                found.setdefault(model, []).append(inst.name)
    return found


Op = tuple[str, Any, Any, Any]
OPS = st.one_of(
    st.tuples(
        st.just("poll"),
        st.sampled_from(NAMES),
        st.dictionaries(st.sampled_from(MODELS), STATES, max_size=3),
        st.booleans(),
    ),
    st.tuples(st.just("down"), st.sampled_from(NAMES), st.none(), st.none()),
    st.tuples(st.just("begin"), st.sampled_from(NAMES), st.sampled_from(MODELS), st.none()),
    st.tuples(st.just("end"), st.sampled_from(NAMES), st.sampled_from(MODELS), st.booleans()),
    st.tuples(st.just("evict"), st.sampled_from(NAMES), st.sampled_from(MODELS), STATES),
    st.tuples(st.just("warmed"), st.sampled_from(NAMES), st.sampled_from(MODELS), st.none()),
    st.tuples(st.just("request"), st.sampled_from(NAMES), st.sampled_from(MODELS), st.none()),
    st.tuples(
        st.just("reload"),
        st.sets(st.sampled_from(NAMES), min_size=1),
        st.sets(st.sampled_from(NAMES)),
        st.none(),
    ),
)


def apply(registry: Registry, op: Op) -> None:
    kind, name, what, how = op
    if kind == "reload":
        kept = tuple(n for n in NAMES if n in name)
        new = settings(kept, frozenset(what))
        registry.reconfigure(new.instances, Catalog(new))
        return
    if not registry.has(name):
        return
    if kind == "poll":
        generation = registry.generation(name) - (0 if how else 1)  # a stale poll: ignored
        registry.polls.apply_report(name, InstanceReport(what, None), generation)
    elif kind == "down":
        registry.polls.mark_down(name)
    elif kind == "begin":
        registry.swap_marks.begin_swap(name, what, 1.0)
    elif kind == "end":
        registry.swap_marks.end_swap(name, what, ok=how)
    elif kind == "evict":
        registry.swap_marks.evicted(name, what, how)
    elif kind == "warmed":
        registry.swap_marks.warmed(name, what)
    else:
        registry.traffic.begin_request(name, what)
        registry.traffic.end_request(name, what)


@BOUNDED
@given(st.lists(OPS, max_size=40))
def test_the_index_equals_a_walk_of_the_fleet_after_any_changes(ops: list[Op]) -> None:
    first = settings(NAMES)
    registry = Registry(first.instances, Catalog(first))
    for op in ops:
        apply(registry, op)
        expected = walked(registry)
        assert registry.copies.every() == expected
        for model in MODELS:
            assert registry.copies.of(model) == expected.get(model, [])


def test_copies_are_in_the_configs_order_and_leave_when_cold() -> None:
    first = settings(NAMES)
    registry = Registry(first.instances, Catalog(first))
    for name in ("i3", "i0", "i2"):
        registry.swap_marks.warmed(name, "a")
    registry.swap_marks.begin_swap("i1", "a", 5.0)
    assert registry.copies.of("a") == ["i0", "i1", "i2", "i3"]
    registry.swap_marks.end_swap("i1", "a", ok=False)
    registry.swap_marks.evicted("i0", "a")
    assert registry.copies.of("a") == ["i2", "i3"]
    assert registry.copies.of("b") == []
