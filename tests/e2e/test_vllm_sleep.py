"""``kind: vllm-sleep`` (SPEC §15) against the simulator's ``vllm`` flavour: wakes, not loads."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e
TOKEN = "sleep-admin"
HELLO = [{"role": "user", "content": "hi"}]


def chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": 3}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def test_two_servers_on_one_gpu_take_turns_by_waking_never_loading() -> None:
    with (
        simulator("vllm", models=("a",), wake_time=0.5) as a,
        simulator("vllm", models=("b",), wake_time=0.5, asleep=1) as b,
    ):
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "instances": [{"name": "gpu", "kind": "vllm-sleep", "capacity": 1,
                           "servers": {"a": a.url, "b": b.url}}],
        }  # fmt: skip
        with gateway(config, {"SWAPGATE_ADMIN_TOKEN": TOKEN}) as gw:
            state = _state(gw.url)
            assert _models(state) == {"a": "warm", "b": "asleep"}
            for model in ("a", "b", "a", "b"):
                answer = chat(gw.url, model)
                assert answer.status_code == 200, answer.text
                assert f"Hello from {model}" in answer.text
            state, metrics = _state(gw.url), gw.metrics()
            a_stats, b_stats = a.stats(), b.stats()
    assert _models(state) == {"a": "asleep", "b": "warm"}
    assert (a_stats["sleeps"], a_stats["wakes"]) == (2, 1)
    assert (b_stats["sleeps"], b_stats["wakes"]) == (1, 2)
    assert a_stats["loads"] == b_stats["loads"] == {}, "no cold load"
    wakes = re.search(r'swapgate_wake_duration_seconds_count\{instance="gpu",model="b",'
                      r'result="ok"\} (\S+)', metrics)  # fmt: skip
    assert wakes is not None
    assert float(wakes[1]) == 2
    eta = state["models"]["a"]["eta_seconds"]["gpu"]  # a is asleep: its wake, measured once
    assert 0.4 < eta < 2.0, "the measured wake feeds the ETA shown"


def test_a_request_goes_to_the_copy_asleep_rather_than_the_one_cold() -> None:
    with (
        simulator("vllm", models=("m",), wake_time=1.0, asleep=1) as sleepy,
        simulator(models=("m",), load_time=10.0) as cold,
    ):
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0, "expected_swap": "10s"},
            "keepalive": {"early_headers_after": "200ms", "interval": "300ms"},
            "instances": [
                instance("cold", cold),
                {"name": "sleepy", "kind": "vllm-sleep", "servers": {"m": sleepy.url}},
            ],
        }
        with gateway(config) as gw:
            started = time.monotonic()
            body = {"model": "m", "messages": HELLO, "max_tokens": 3, "stream": True}
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body,
                              timeout=30) as response:  # fmt: skip
                lines = list(response.iter_lines())
            waited = time.monotonic() - started
            route = httpx.get(f"{gw.url}/metrics", timeout=5).text
            cold_loads = cold.stats()["loads"]
    assert lines[0].startswith(": swapgate waking m on sleepy"), lines[0]
    assert [line for line in lines if line][-2] == "data: [DONE]"  # then how long it waited
    assert 0.9 < waited < 5.0, f"about the 1 s wake, not the 10 s load: {waited:.1f}s"
    assert 'swapgate_requests_total{model="m",route="instance/sleepy",status="200"} 1.0' in route
    assert cold_loads == {}


def _state(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    data: dict[str, Any] = answer.json()
    return data


def _models(state: dict[str, Any]) -> dict[str, str]:
    return {name: view["state"] for name, view in state["instances"][0]["models"].items()}
