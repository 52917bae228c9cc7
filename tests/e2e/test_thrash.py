"""Thrash made visible (issue 23): placements by kind, and swaps that undo a recent eviction."""

from __future__ import annotations

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
    swapped = sum(metric_in(metrics, "swapgate_placements_total", model=m, placement="swap")
                  for m in ("a", "b"))  # fmt: skip
    assert swapped == len(sequence) - 1 - (sequence[-1] == sequence[-2])
