"""``/metrics`` writes the live-state and decay gauges as text of its own
(swapgate/live_gauges.py): it says exactly what prometheus_client's ``generate_latest`` says of
the same registry, whatever the instances, their models (names with quotes, backslashes,
newlines), states and figures, scrape after scrape while the states change."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swapgate.data.snapshot import InstanceView, ModelView, Snapshot
from swapgate.data.warm import WarmState
from swapgate.live_gauges import EngineRow
from swapgate.metrics import Metrics
from tests.unit.strategies import BOUNDED

NAMES = st.text(st.sampled_from('ab"\\\nçx-'), min_size=1, max_size=4)
STATES = st.sampled_from(list(WarmState))


def instance(name: str, serves: frozenset[str], states: dict[str, WarmState]) -> InstanceView:
    models = {model: ModelView(state, 0.0, 0.0, 0, 0.0) for model, state in states.items()}
    return InstanceView(name, True, False, 1, 1.0, len(states), serves, models, None, 0.0, 0.0)


FLEETS = st.dictionaries(
    NAMES,
    st.tuples(st.frozensets(NAMES, max_size=4), st.dictionaries(NAMES, STATES, max_size=3)),
    max_size=4,
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


FIGURES = st.none() | st.floats(allow_nan=False)
ROWS = st.lists(
    st.tuples(NAMES, NAMES, FIGURES, FIGURES, st.sampled_from(["healthy", "kv-growth"])),
    max_size=3,
)


@BOUNDED
@given(
    st.lists(FLEETS, min_size=1, max_size=3),
    st.dictionaries(NAMES, st.integers(0, 9)),
    ROWS,
)
def test_the_live_gauges_read_as_generate_latest_writes_them(
    scrapes: list[dict[str, tuple[frozenset[str], dict[str, WarmState]]]],
    depths: dict[str, int],
    rows: list[EngineRow],
) -> None:
    metrics = Metrics()
    fleet: list[Snapshot] = []
    metrics.watch(lambda: fleet[-1], lambda: depths)
    metrics.watch_decay(lambda: rows, ["healthy", "kv-growth", "global"])
    metrics.requests.labels("a", "instance/x", "200").inc()  # one of the others, as before
    for states in scrapes:  # the same metrics scraped again as the fleet changes
        views = tuple(instance(n, serves, models) for n, (serves, models) in states.items())
        fleet.append(Snapshot(0.0, views))
        ours = metrics.exposition().decode()
        theirs = generate_latest(metrics.registry).decode()
        assert samples(ours) == samples(theirs)
        assert sorted(ours.splitlines()) == sorted(theirs.splitlines())


def test_an_instance_whose_models_did_not_change_keeps_its_lines() -> None:
    metrics = Metrics()
    snap = [Snapshot(0.0, (instance("gpu-a", frozenset({"a", "b"}), {"a": WarmState.WARM}),))]
    metrics.watch(lambda: snap[0], dict)
    first = metrics.exposition().decode()
    assert 'swapgate_model_warm{instance="gpu-a",model="a"} 1.0' in first
    assert 'swapgate_model_warm{instance="gpu-a",model="b"} 0.0' in first
    snap[0] = Snapshot(0.0, (instance("gpu-a", frozenset({"a", "b"}), {"b": WarmState.WARM}),))
    second = metrics.exposition().decode()
    assert 'swapgate_model_warm{instance="gpu-a",model="a"} 0.0' in second
    assert 'swapgate_model_warm{instance="gpu-a",model="b"} 1.0' in second
