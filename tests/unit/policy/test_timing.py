"""Routing times that follow the measured swaps when unset (swapgate/policy/timing.py)."""

from __future__ import annotations

import pytest

from swapgate.config.loading import parse_config
from swapgate.control.routing.router import starvation_point
from swapgate.control.swaps.times import SwapTimes
from swapgate.policy import timing
from swapgate.policy.placement import Policy, Queue, Swap, frees_up_at, place
from tests.unit.policy.test_placement import NOW, I, snap, warm

SELF_TUNED = Policy(min_residency=None, eta=lambda instance, model: {"b": 2.0}.get(model, 60.0))


@pytest.mark.parametrize(
    ("used_ago", "victim", "decision"),
    [
        (3.0, "b", Swap("x", ("b",))),  # b loads in 2 s: 3 s of use repaid it
        (1.5, "b", Queue("x")),
        (3.0, "c", Queue("x")),  # c loads in 60 s: 3 s is far from repaying it
        (61.0, "c", Swap("x", ("c",))),
    ],
)
def test_unset_residency_is_the_victims_own_swap_time(
    used_ago: float, victim: str, decision: object
) -> None:
    instance = I("x", {victim: warm(used=NOW - used_ago)})
    assert place("a", snap(instance), SELF_TUNED) == decision


def test_a_set_min_residency_is_used_as_it_is() -> None:
    fixed = Policy(min_residency=30.0, eta=SELF_TUNED.eta)
    assert place("a", snap(I("x", {"b": warm(used=NOW - 3.0)})), fixed) == Queue("x")
    assert place("a", snap(I("x", {"c": warm(used=NOW - 31.0)})), fixed) == Swap("x", ("c",))


def test_residency_is_bounded() -> None:
    assert timing.residency(None, 0.05) == timing.RESIDENCY_BOUNDS[0]
    assert timing.residency(None, 3600.0) == timing.RESIDENCY_BOUNDS[1]
    assert timing.residency(0.0, 3600.0) == 0.0


def test_the_queue_expects_room_when_the_victims_residency_ends() -> None:
    instance = snap(I("x", {"b": warm(used=NOW - 0.5)})).instance("x")
    assert frees_up_at(instance, NOW, SELF_TUNED) == pytest.approx(NOW + 1.5)


def test_an_unmeasured_swap_is_expected_to_take_what_the_nearest_measured_ones_did() -> None:
    times = SwapTimes(expected=None)
    assert times.eta("x", "a") == timing.EXPECTED_SWAP  # nothing measured yet
    assert times.guessing(), "a guess, which no progress line tells as a figure"
    times.record("y", "b", 4.0, "wake")
    assert times.guessing(), "a wake says nothing of how long a load takes"
    times.record("y", "b", 4.0)
    assert not times.guessing()
    assert times.eta("x", "a") == 4.0  # any swap
    times.record("x", "c", 2.0)
    assert times.eta("x", "a") == 2.0  # other models on this instance
    times.record("y", "a", 9.0)
    assert times.eta("x", "a") == 9.0  # this model on another instance
    times.record("x", "a", 1.0)
    assert times.eta("x", "a") == 1.0  # measured here
    assert times.eta("x", "a", "wake") == 1.0  # a wake never takes longer than a load


def test_a_first_swap_is_expected_from_its_weights_at_the_rate_others_read_theirs() -> None:
    times = SwapTimes(expected=None, sizes={"small": 2_000_000_000, "big": 14_000_000_000})
    assert times.eta("x", "big") == timing.EXPECTED_SWAP, "no rate known yet"
    times.record("x", "small", 4.0)  # 2 GB in 4 s: 0.5 GB/s
    assert times.eta("x", "big") == pytest.approx(28.0), "14 GB at 0.5 GB/s, not small's 4 s"
    assert times.eta("x", "unsized") == 4.0, "no size known: the instance's other swaps"


def test_a_set_expected_swap_is_used_until_measured() -> None:
    times = SwapTimes(expected=12.0)
    assert not times.guessing(), "the operator's figure is told"
    times.record("y", "a", 1.0)
    assert times.eta("x", "a") == 12.0


@pytest.mark.parametrize(
    ("routing", "swap", "point"),
    [
        ({}, 2.0, 2.0),  # unset: its swap time
        ({}, 0.1, timing.STARVATION_FLOOR),
        ({}, 60.0, 30.0),  # never later than a quarter of max_wait (120 s)
        ({"max_wait": "8s"}, 5.0, 2.0),
        ({"starvation_after": 0.5}, 2.0, 60.0),  # set: a fraction of max_wait, as before
    ],
)
def test_the_starvation_point(routing: dict[str, object], swap: float, point: float) -> None:
    times = SwapTimes(expected=None)
    times.record("x", "a", swap)

    settings = parse_config({"instances": [{"name": "x", "url": "http://x"}], "routing": routing})
    assert starvation_point(settings, lambda m: times.eta("x", m), "a") == pytest.approx(point)


@pytest.mark.parametrize(
    ("done_by", "now", "told"),
    [
        (107.0, 100.0, 7),  # a 7 s load at its start: the expected 7 s
        (107.0, 103.5, 4),  # counted down, rounded up
        (100.3, 100.1, 1),  # unmeasured and expected quicker than it runs: never 0
        (101.0, 112.0, 6),  # 12 s in, 11 s past its expected end: half as long again
    ],
)
def test_a_running_swaps_eta_counts_down_and_is_never_0(done_by, now, told) -> None:
    assert timing.remaining(done_by, began=100.0, now=now) == told
