"""The swap benchmark's offline scorers count what they claim on traces small enough to check by
hand (a wrong scorer would make the benchmark's yardstick wrong)."""

from __future__ import annotations

import pytest

from bench import trace
from bench.trace import Request

# A, B, A, B ... every 5 s: one instance swaps at every change of model when it serves in order.
ALTERNATING = [Request(5.0 * i, "ab"[i % 2], 10) for i in range(8)]


def test_in_order_scorers_on_an_alternating_trace() -> None:
    assert trace.one_instance(ALTERNATING) == 8
    assert trace.round_robin(ALTERNATING, 2) == 2  # even requests on one instance, odd on the other
    assert trace.lru(ALTERNATING, 1) == 8
    assert trace.belady(ALTERNATING, 2) == 2


def test_belady_evicts_the_model_needed_furthest_ahead() -> None:
    requests = [Request(float(i), m, 10) for i, m in enumerate("abcabcab")]
    # two slots: LRU always evicts the model needed next; Belady keeps one of a/b through the c's
    assert trace.lru(requests, 2) == 8
    assert trace.belady(requests, 2) == 5


def test_the_optimum_that_may_hold_requests_groups_them() -> None:
    # with 40 s to spare a single instance serves all a's, then all b's: two loads
    assert trace.optimum(ALTERNATING, 1, max_wait=40.0, swap_time=10.0) == 2
    # with only 10 s to spare (and 2 s swaps) the b's cannot all wait for the a's: more loads
    assert 2 < trace.optimum(ALTERNATING, 1, max_wait=10.0, swap_time=2.0) < 8
    # 10 s swaps and 10 s to spare: no schedule serves them all on one instance
    with pytest.raises(RuntimeError, match="infeasible"):
        trace.optimum(ALTERNATING, 1, max_wait=10.0, swap_time=10.0)
    # two instances hold both models: one load each
    assert trace.optimum(ALTERNATING, 2, max_wait=10.0, swap_time=10.0) == 2


def test_the_optimum_is_a_lower_bound_of_the_in_order_scorers() -> None:
    requests = trace.generate(seed=7, duration=300.0)
    for instances in (2, 3):
        best = trace.optimum(requests, instances, max_wait=60.0, swap_time=20.0)
        assert 0 < best <= trace.belady(requests, instances) <= trace.lru(requests, instances)


def test_the_optimum_says_when_no_schedule_exists() -> None:
    at_once = [Request(0.0, m, 10) for m in "abc"]  # three models at once, two slots, no wait
    with pytest.raises(RuntimeError, match="infeasible"):
        trace.optimum(at_once, 2, max_wait=0.0, swap_time=10.0)
