"""Thrash made visible (issue 23): placements by kind, and swaps that undo a recent eviction."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx
import pytest

from tests.e2e.processes import gateway, instance, metric_in, simulator

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("sequence", "thrash"),
    [
        (("a", "a", "b", "a"), {"a": 1, "b": 0}),  # a is back within 5 swap times of leaving
        (("a", "a", "b", "b"), {"a": 0, "b": 0}),  # nothing evicted comes back
    ],
)
def test_the_thrash_counter_rises_only_when_an_evicted_model_comes_back_soon(
    sequence: tuple[str, ...], thrash: dict[str, int]
) -> None:
    with simulator(models=("a", "b"), load_time=0.3) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0, "expected_swap": "1s"},
            "instances": [instance("gpu", sim)],
        }
        with gateway(config) as gw:
            for model in sequence:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
                assert answer.status_code == 200
            metrics = gw.metrics()
    for model, count in thrash.items():
        assert metric_in(metrics, "swapgate_thrash_total", instance="gpu", model=model) == count
    assert metric_in(metrics, "swapgate_placements_total", model="a", placement="warm") == 1
    swapped = sum(
        metric_in(metrics, "swapgate_placements_total", model=m, placement="swap")
        for m in ("a", "b")
    )
    assert swapped == len(sequence) - 1 - (sequence[-1] == sequence[-2])


def test_requests_that_share_a_swap_count_as_swaps_avoided_and_their_waits_by_placement() -> None:
    with simulator(models=("a",), load_time=1.0) as sim:
        config = {"routing": {"poll_interval": "1h"}, "instances": [instance("gpu", sim)]}
        with gateway(config) as gw, ThreadPoolExecutor(6) as pool:
            body = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
            post = partial(httpx.post, f"{gw.url}/v1/chat/completions", json=body, timeout=30)
            assert {r.status_code for r in pool.map(lambda _: post(), range(6))} == {200}
            assert post().status_code == 200  # warm now
            metrics = gw.metrics()
    assert metric_in(metrics, "swapgate_swaps_total", model="a") == 1
    assert metric_in(metrics, "swapgate_swaps_avoided_total", model="a") == 5  # 6 shared 1 swap
    waits = partial(metric_in, metrics, model="a")
    assert waits("swapgate_placement_wait_seconds_count", placement="swap") == 6
    assert waits("swapgate_placement_wait_seconds_sum", placement="swap") >= 6 * 0.9
    assert waits("swapgate_placement_wait_seconds_count", placement="warm") == 1
    assert waits("swapgate_placement_wait_seconds_sum", placement="warm") == 0
