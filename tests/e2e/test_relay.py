"""Relay fallback while a swap runs, failover when instances die, and models that never leave.

A simulator plays the relay: it serves only the relay's model name and refuses any key but its
own, so a 200 from it proves the mapping and that the client's key never travelled.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Gateway, Sim, chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
CLIENT_KEY = "client-key"
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
RELAY_KEY = "relay-secret"
ENV = {"TEST_CLIENT_KEYS": CLIENT_KEY, "TEST_RELAY_KEY": RELAY_KEY}


@pytest.fixture(scope="module")
def relay() -> Iterator[Sim]:
    with simulator("openai", models=("remote-a", "remote-b"), api_key=RELAY_KEY) as sim:
        yield sim


def _config(
    relay: Sim, instances: list[dict[str, Any]], models: dict[str, Any], **routing: Any
) -> dict[str, Any]:
    return {
        "server": {"api_keys_env": "TEST_CLIENT_KEYS"},
        "routing": {"poll_interval": "200ms", "min_residency": 0, **routing},
        # Commit no early 200 here: these tests read the final route from the headers.
        "keepalive": {"early_headers_after": "30s"},
        "instances": instances,
        "relays": {"cloud": {"url": f"{relay.url}/v1", "api_key_env": "TEST_RELAY_KEY"}},
        "models": models,
    }


def test_swap_policy_answers_from_the_relay_while_the_swap_runs(relay) -> None:
    with simulator(models=("a",), load_time=3.0) as node:
        models = {"a": {"relay": "cloud", "relay_model": "remote-a", "fallback": "swap"}}
        with gateway(_config(relay, [instance("gpu-a", node)], models), ENV) as gw:
            started = time.monotonic()
            response = chat(gw.url, "a", headers=AUTH)
            assert time.monotonic() - started < 1.0
            assert response.status_code == 200, response.text
            assert response.headers["x-swapgate-route"] == "relay/cloud"
            assert response.json()["model"] == "remote-a"
            assert node.stats()["resident"] == {"a": "starting"}, "the swap still runs"

            stream = _stream_through(gw, "a")
            assert stream["route"] == "relay/cloud"
            assert stream["text"] == "Hello from remote-a."

            wait_for(lambda: node.stats()["resident"] == {"a": "ready"}, timeout=5)
            wait_for(lambda: 'swapgate_model_warm{instance="gpu-a",model="a"} 1.0' in gw.metrics())
            after = chat(gw.url, "a", headers=AUTH)
            assert after.headers["x-swapgate-route"] == "instance/gpu-a"
            assert after.json()["model"] == "a"
            assert node.loads() == 1
            metrics = gw.metrics()
            assert 'swapgate_fallbacks_total{model="a",reason="swap",relay="cloud"} 2.0' in metrics


def _stream_through(gw: Gateway, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": [], "stream": True, "max_tokens": 4}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    text, times = "", []
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                times.append(time.monotonic())
                text += (
                    httpx.Response(200, content=line[6:])
                    .json()["choices"][0]["delta"]
                    .get("content", "")
                )
        route = response.headers["x-swapgate-route"]
    assert times[-1] - times[0] > 0.05, "chunks arrived spread out, not buffered"
    return {"route": route, "text": text}


def test_slow_policy_relays_when_the_measured_eta_exceeds_max_wait(relay) -> None:
    slow_node = simulator(models=("big",), load_time=2.5)
    fast_node = simulator(models=("small",), load_time=0.3)
    with slow_node as slow, fast_node as fast:
        relayed = {"relay": "cloud", "fallback": "slow"}
        models = {
            "big": {**relayed, "relay_model": "remote-a", "max_wait": "1500ms"},
            "small": {**relayed, "relay_model": "remote-b", "max_wait": "5s"},
        }
        instances = [instance("gpu-slow", slow), instance("gpu-fast", fast)]
        with gateway(_config(relay, instances, models, expected_swap="1s"), ENV) as gw:
            # Never measured: the 1 s default ETA is inside max_wait, so it waits for the swap.
            assert (
                chat(gw.url, "small", headers=AUTH).headers["x-swapgate-route"]
                == "instance/gpu-fast"
            )

            first = chat(
                gw.url, "big", headers=AUTH
            )  # ETA 1 s < 1.5 s: waits; the swap takes 2.5 s
            assert first.headers["x-swapgate-route"] == "relay/cloud"  # max_wait passed
            wait_for(lambda: slow.stats()["resident"] == {"big": "ready"}, timeout=5)
            httpx.post(f"{slow.url}/api/models/unload/big", timeout=5).raise_for_status()
            wait_for(
                lambda: 'swapgate_model_warm{instance="gpu-slow",model="big"} 0.0' in gw.metrics()
            )

            started = time.monotonic()
            second = chat(
                gw.url, "big", headers=AUTH
            )  # measured ETA 2.5 s > 1.5 s: relayed at once
            assert second.headers["x-swapgate-route"] == "relay/cloud"
            assert time.monotonic() - started < 1.0
            assert 'reason="slow",relay="cloud"} 1.0' in gw.metrics()


def test_an_instance_killed_mid_traffic_loses_no_request(relay) -> None:
    with (
        simulator(models=("a",), load_time=0.2) as one,
        simulator(models=("a",), load_time=0.2) as two,
    ):
        for node in (one, two):
            httpx.get(f"{node.url}/upstream/a/health", timeout=5).raise_for_status()
        models = {"a": {"relay": "cloud", "relay_model": "remote-a", "fallback": "error"}}
        instances = [instance("gpu-a", one), instance("gpu-b", two)]
        with gateway(_config(relay, instances, models), ENV) as gw:
            answered: list[httpx.Response] = []
            sent = 60
            killer = threading.Timer(0.6, one.kill)
            killer.start()
            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
                answered = list(
                    pool.map(lambda _: chat(gw.url, "a", max_tokens=8, headers=AUTH), range(sent))
                )
            killer.join()
            assert len(answered) == sent
            outcomes = [r.headers["x-swapgate-route"] for r in answered if r.status_code == 200]
            errors = [r.json()["error"]["code"] for r in answered if r.status_code != 200]
            assert len(outcomes) + len(errors) == sent
            assert not errors, errors
            assert {"instance/gpu-a", "instance/gpu-b"} <= set(outcomes)
            assert one.process.poll() is not None, "gpu-a was killed during the run"


def test_fallback_off_never_leaves_the_premises(relay) -> None:
    before = relay.stats()["requests"]
    with simulator(models=("private",), load_time=0.2) as node:
        models = {"private": {"relay": "cloud", "relay_model": "remote-a", "fallback": "off"}}
        with gateway(_config(relay, [instance("gpu-a", node)], models, queue_limit=1), ENV) as gw:
            assert (
                chat(gw.url, "private", headers=AUTH).headers["x-swapgate-route"]
                == "instance/gpu-a"
            )
            node.kill()
            wait_for(lambda: httpx.get(f"{gw.url}/readyz").status_code == 503)
            response = chat(gw.url, "private", headers=AUTH)
            assert response.status_code in (502, 503)
            response = chat(gw.url, "private", headers=AUTH)
            assert response.status_code == 503
            assert response.headers["retry-after"]
            assert response.json()["error"]["code"] == "no_capacity"
    assert relay.stats()["requests"] == before, "the relay saw nothing"


def test_a_full_queue_relays_or_answers_429(relay) -> None:
    with simulator(models=("a", "private"), load_time=1.5, capacity=2) as node:
        models = {
            "a": {"relay": "cloud", "relay_model": "remote-a", "fallback": "error"},
            "private": {"relay": "cloud", "fallback": "off"},
        }
        instances = [instance("gpu-a", node, capacity=2)]
        with gateway(_config(relay, instances, models, queue_limit=2), ENV) as gw:
            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
                answers = list(
                    pool.map(lambda m: chat(gw.url, m, headers=AUTH), ["a"] * 4 + ["private"] * 4)
                )
            a_routes = sorted(r.headers["x-swapgate-route"] for r in answers[:4])
            assert a_routes == ["instance/gpu-a"] * 2 + ["relay/cloud"] * 2
            private = sorted(r.status_code for r in answers[4:])
            assert private == [200, 200, 429, 429]
            refused = next(r for r in answers[4:] if r.status_code == 429)
            assert refused.json()["error"]["code"] == "queue_full"
            assert refused.headers["retry-after"]
