"""Thrash made visible (issue 23): placements by kind, and swaps that undo a recent eviction."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e


def sample(metrics: str, name: str, **labels: str) -> float:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"{name}\{{{re.escape(inner)}\}} (\S+)", metrics)
    return float(found[1]) if found else 0.0


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
        assert sample(metrics, "swapgate_thrash_total", instance="gpu", model=model) == count
    assert sample(metrics, "swapgate_placements_total", model="a", placement="warm") == 1
    swapped = sum(sample(metrics, "swapgate_placements_total", model=m, placement="swap")
                  for m in ("a", "b"))  # fmt: skip
    assert swapped == len(sequence) - 1 - (sequence[-1] == sequence[-2])
