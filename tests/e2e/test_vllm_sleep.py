"""``kind: vllm-sleep`` (docs/configuration.md) against the simulator's ``vllm`` flavour: wakes, not
loads."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from tests.e2e.processes import chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "sleep-admin"
HELLO = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("level", [1, 2])
def test_two_servers_on_one_gpu_take_turns_by_waking_never_loading(level: int) -> None:
    """Level 2 drops the weights: each wake reads them again before any request is served."""
    with (
        simulator("vllm", models=("a",), wake_time=0.5, load_time=0.2) as a,
        simulator("vllm", models=("b",), wake_time=0.5, load_time=0.2, asleep=level) as b,
    ):
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "instances": [
                {
                    "name": "gpu",
                    "kind": "vllm-sleep",
                    "capacity": 1,
                    "sleep_level": level,
                    "servers": {"a": a.url, "b": b.url},
                }
            ],
        }
        with gateway(config, {"SWAPGATE_ADMIN_TOKEN": TOKEN}) as gw:
            state = _state(gw.url)
            assert _models(state) == {"a": "warm", "b": "asleep"}
            listed = httpx.get(f"{gw.url}/v1/models").json()["data"]
            assert {m["id"]: m["status"]["value"] for m in listed} == {
                "a": "loaded",
                "b": "sleeping",
            }, "as llama.cpp's router writes it"
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
    assert a_stats["held_asleep"] == b_stats["held_asleep"] == 0, "none sent to a sleeper"
    assert a_stats["stale_answers"] == b_stats["stale_answers"] == 0, "no undefined weights"
    reloads = (1, 2) if level == 2 else (0, 0)
    assert (a_stats["weight_reloads"], b_stats["weight_reloads"]) == reloads
    wakes = re.search(
        r'swapgate_wake_duration_seconds_count\{instance="gpu",model="b",'
        r'result="ok"\} (\S+)',
        metrics,
    )
    assert wakes is not None
    assert float(wakes[1]) == 2
    eta = state["models"]["a"]["eta_seconds"]["gpu"]  # a is asleep: its wake, measured once
    assert 0.4 < eta < 3.0, "the measured wake feeds the ETA shown"


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
            with httpx.stream(
                "POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30
            ) as response:
                lines = list(response.iter_lines())
            waited = time.monotonic() - started
            route = httpx.get(f"{gw.url}/metrics", timeout=5).text
            cold_loads = cold.stats()["loads"]
    assert lines[0].startswith(": swapgate waking m on sleepy"), lines[0]
    assert [line for line in lines if line][-2] == "data: [DONE]"  # then how long it waited
    assert 0.9 < waited < 5.0, f"about the 1 s wake, not the 10 s load: {waited:.1f}s"
    assert 'swapgate_requests_total{model="m",route="instance/sleepy",status="200"} 1.0' in route
    assert cold_loads == {}


def test_what_is_awake_beyond_capacity_is_put_to_sleep_at_start_and_after_a_wake_by_hand() -> None:
    with (
        simulator("vllm", models=("a",), wake_time=0.1) as a,
        simulator("vllm", models=("b",), wake_time=0.1) as b,
    ):
        config = {
            "routing": {"poll_interval": "300ms", "min_residency": 0},
            "instances": [
                {
                    "name": "gpu",
                    "kind": "vllm-sleep",
                    "capacity": 1,
                    "servers": {"a": a.url, "b": b.url},
                }
            ],
        }
        with gateway(config, {"SWAPGATE_ADMIN_TOKEN": TOKEN}) as gw:
            wait_for(lambda: sorted(_models(_state(gw.url)).values()) == ["asleep", "warm"])
            assert chat(gw.url, "b").status_code == 200
            asleep = "a"
            assert _models(_state(gw.url)) == {"a": "asleep", "b": "warm"}
            httpx.post(f"{a.url}/wake_up", timeout=5).raise_for_status()  # by hand
            wait_for(lambda: a.stats()["sleeps"] == 2)
            after = _models(_state(gw.url))
    assert asleep == "a"
    assert after == {"a": "asleep", "b": "warm"}, "the one woken by hand, less wanted, sleeps"


@pytest.mark.parametrize("fault", ["fails", "hangs"])
def test_a_wake_that_fails_or_hangs_is_a_failed_swap_with_backoff_and_an_answer(
    fault: str,
) -> None:
    faults = {"fail_load_rate": 1.0, "wake_time": 0.1} if fault == "fails" else {"wake_time": 60}
    with simulator("vllm", models=("m",), asleep=1, **faults) as sleepy:
        config = {
            "routing": {"poll_interval": "1h", "swap_timeout": "1s"},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [{"name": "gpu", "kind": "vllm-sleep", "servers": {"m": sleepy.url}}],
        }
        with gateway(config, {"SWAPGATE_ADMIN_TOKEN": TOKEN}) as gw:
            answer = chat(gw.url, "m")
            state = _state(gw.url)
            swaps = gw.metrics()
        sleepy.kill()  # its hung wake would hold up its graceful stop
    result = "failed" if fault == "fails" else "timeout"
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "swap_failed", answer.text
    assert f'swapgate_swaps_total{{instance="gpu",model="m",result="{result}"}} 1.0' in swaps
    assert state["instances"][0]["models"]["m"]["backoff_until"] is not None, "m backs off"
    assert state["instances"][0]["backoff_until"] is None, "its instance does not"


def _state(url: str) -> dict[str, Any]:
    answer = httpx.get(f"{url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    data: dict[str, Any] = answer.json()
    return data


def _models(state: dict[str, Any]) -> dict[str, str]:
    return {name: view["state"] for name, view in state["instances"][0]["models"].items()}


def test_a_server_that_dies_fails_only_its_model_and_comes_back_awake_reconciled() -> None:
    """What the real vLLM test showed with a restart (tests/engine/test_vllm.py), whose second
    start of vLLM cost ~17 s of CPU: a server restarted on its port starts awake, as ``vllm
    serve`` does, and swapgate takes it back and puts one of the two to sleep."""
    config: dict[str, Any] = {
        "routing": {"poll_interval": "300ms", "min_residency": 0},
        "instances": [{"name": "gpu", "kind": "vllm-sleep", "capacity": 1, "servers": {}}],
    }
    with (
        simulator("vllm", models=("b",), wake_time=0.1) as b,
        simulator("vllm", models=("a",), wake_time=0.1) as a,
    ):
        config["instances"][0]["servers"] = {"a": a.url, "b": b.url}
        port = httpx.URL(a.url).port
        with gateway(config, {"SWAPGATE_ADMIN_TOKEN": TOKEN}) as gw:
            assert chat(gw.url, "b").status_code == 200
            a.kill()
            wait_for(lambda: _state(gw.url)["instances"][0]["models"]["a"]["unreachable"])
            dead = chat(gw.url, "a")
            b_codes = [chat(gw.url, "b").status_code for _ in range(3)]
            with simulator("vllm", models=("a",), wake_time=0.1, port=port) as again:
                back = time.monotonic()
                wait_for(lambda: not _state(gw.url)["instances"][0]["models"]["a"]["unreachable"])
                answers = (chat(gw.url, "a").status_code, chat(gw.url, "b").status_code)
                both_back_after = time.monotonic() - back
                wait_for(lambda: _awake({"a": again.url, "b": b.url}) in ({"a"}, {"b"}))
                awake = _awake({"a": again.url, "b": b.url})
    assert dead.status_code == 503, dead.text
    assert "does not answer" in dead.json()["error"]["message"], dead.text
    assert b_codes == [200] * 3, "b answered throughout"
    assert answers == (200, 200)
    assert both_back_after < 15
    assert len(awake) == 1, "one of the two put back to sleep"


def _awake(servers: dict[str, str]) -> set[str]:
    return {
        name
        for name, url in servers.items()
        if not httpx.get(f"{url}/is_sleeping", timeout=5).json()["is_sleeping"]
    }
