"""Faults after the answer began, and upstreams that refuse swapgate's key (issue 15)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Sim, gateway, instance, simulator, wait_for
from tests.e2e.wire import post

pytestmark = pytest.mark.e2e
CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_an_upstream_that_stalls_mid_stream_ends_it_with_one_error_event() -> None:
    with simulator(load_time=0.1) as sim:
        config = {
            "routing": {"stream_idle_timeout": "1s", "min_residency": 0},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            warm = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30)
            assert warm.status_code == 200
            # One token every 3 s: after the first chunk, silent past the 1 s limit.
            sim.faults(token_rate=0.33)
            response = post(gw.url, "/v1/chat/completions", {**CHAT, "stream": True})
            failed = 'swapgate_requests_total{model="a",route="instance/gpu-a",status="504"} 1.0'
            wait_for(lambda: failed in gw.metrics())  # counted once the answer has ended
            metrics = gw.metrics()
    assert response.status == 200
    events = response.data_lines()
    assert json.loads(events[0].removeprefix("data: "))["object"] == "chat.completion.chunk"
    errors = [json.loads(e.removeprefix("data: ")) for e in events if '"error"' in e]
    assert len(errors) == 1
    assert errors[0]["error"]["code"] == "upstream_timeout"
    assert "error" in json.loads(events[-1].removeprefix("data: "))  # nothing after it
    assert 'status="200"} 1.0' in metrics  # the warm-up only
    assert 'swapgate_upstream_errors_total{instance="gpu-a",kind="stall"} 1.0' in metrics


def test_one_bodiless_502_from_the_only_instance_is_tried_again_there_two_are_told() -> None:
    # llama-swap answers so when its kept-alive connection to its engine was closed under it
    with simulator(load_time=0.1) as sim:
        config = {"instances": [instance("gpu-a", sim)]}
        with gateway(config) as gw:
            quiet = {"x-swapgate-keepalive": "off"}
            url = f"{gw.url}/v1/chat/completions"
            assert httpx.post(url, json=CHAT, headers=quiet, timeout=30).status_code == 200
            sim.faults(bad_gateway_next=1)
            again = httpx.post(url, json=CHAT, headers=quiet, timeout=30)
            sim.faults(bad_gateway_next=2)
            twice = httpx.post(url, json=CHAT, headers=quiet, timeout=30)
            metrics = gw.metrics()
    assert again.status_code == 200, again.text
    assert again.headers["x-swapgate-route"] == "instance/gpu-a"
    assert twice.status_code == 502, "once more, not forever"
    assert 'swapgate_upstream_errors_total{instance="gpu-a",kind="http"} 2.0' in metrics


def _two_warm(one: Sim, two: Sim) -> dict[str, Any]:
    for node in (one, two):  # each has a warm before the gateway starts
        httpx.get(f"{node.url}/upstream/a/health", timeout=5).raise_for_status()
    return {"instances": [instance("gpu-a", one), instance("gpu-b", two)]}


def test_a_request_that_crashes_its_engine_is_sent_once_and_the_other_copy_is_untouched() -> None:
    """A poison request: the engine it reaches holds it 1.5 s and dies. It is not sent again,
    neither to the other warm copy nor back: one instance down, not two."""
    with (
        simulator(models=("a",), load_time=0.1, crash_on="POISON", crash_after=1.5) as one,
        simulator(models=("a",), load_time=0.1, crash_on="POISON", crash_after=1.5) as two,
        gateway(_two_warm(one, two)) as gw,
    ):
        poison = {**CHAT, "messages": [{"role": "user", "content": "POISON"}]}
        answer = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json=poison,
            headers={"x-swapgate-keepalive": "off"},
            timeout=30,
        )
        wait_for(lambda: one.process.poll() is not None or two.process.poll() is not None)
        alive = [sim for sim in (one, two) if sim.process.poll() is None]
        assert len(alive) == 1, "the one that took it died, the other did not"
        assert alive[0].stats()["requests"] == 0, "the poison never reached the other copy"
        after = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_error"
    assert after.status_code == 200, "the other copy answers the next request"


def test_a_bodiless_502_after_a_hold_is_sent_once_not_to_every_copy() -> None:
    """What llama-swap answers when its engine crashed mid-request: a bodiless 502, after
    holding it. Before the one retry rule, two such copies had the one request sent three
    times."""
    with (
        simulator(models=("a",), load_time=0.1, bad_gateway_hold=1.5) as one,
        simulator(models=("a",), load_time=0.1, bad_gateway_hold=1.5) as two,
        gateway(_two_warm(one, two)) as gw,
    ):
        for sim in (one, two):
            sim.faults(bad_gateway_next=5)
        answer = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json=CHAT,
            headers={"x-swapgate-keepalive": "off"},
            timeout=30,
        )
        sent = one.stats()["requests"] + two.stats()["requests"]
    assert answer.status_code == 502
    assert sent == 1, f"sent {sent} times"


def test_an_upstream_that_refuses_swapgates_key_is_a_502_naming_the_instance_and_its_env() -> None:
    with simulator(load_time=0.1, api_key="the-real-key") as sim:
        config = {"instances": [instance("gpu-a", sim, api_key_env="GPU_A_KEY")]}
        with gateway(config, {"GPU_A_KEY": "a-stale-key"}) as gw:
            answer = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json=CHAT,
                headers={"x-swapgate-keepalive": "off"},
                timeout=30,
            )
            metrics = gw.metrics()
    assert answer.status_code == 502, answer.text
    error = answer.json()["error"]
    assert error["code"] == "upstream_error"
    assert "instance/gpu-a" in error["message"]
    assert "GPU_A_KEY" in error["message"]
    assert "a-stale-key" not in answer.text
    assert 'swapgate_upstream_errors_total{instance="gpu-a",kind="auth"} 1.0' in metrics


def test_a_body_nested_20000_deep_is_an_openai_shaped_400_and_the_gateway_goes_on() -> None:
    with simulator(load_time=0.1) as sim, gateway({"instances": [instance("gpu-a", sim)]}) as gw:
        deep = b'{"model": "a", "x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
        url = f"{gw.url}/v1/chat/completions"
        refused = httpx.post(url, content=deep, headers={"content-type": "application/json"})
        good = httpx.post(url, json=CHAT, timeout=30)
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/json"
    assert refused.json()["error"]["code"] == "invalid_request_error"
    assert "nested too deeply" in refused.json()["error"]["message"]
    assert good.status_code == 200
