"""Warm-aware routing and single-flight swaps across two simulated llama-swap instances."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Gateway, Sim, Sim]]:
    with simulator(load_time=1.0) as one, simulator(load_time=1.0) as two:
        config = {
            "routing": {"poll_interval": "300ms"},
            "keepalive": {"early_headers_after": "30s"},  # final routes in the headers
            "instances": [instance("gpu-a", one), instance("gpu-b", two)],
        }
        with gateway(config) as gw:
            yield gw, one, two


async def _ask(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=4
    )
    answer = raw.parse()
    assert answer.choices[0].message.content
    return answer.model, raw.headers["x-swapgate-route"]


async def test_concurrent_cold_requests_share_one_swap_and_models_spread(fleet) -> None:
    gw, one, two = fleet
    async with gw.async_sdk() as client:
        await _spread_scenario(client, one, two)


async def _spread_scenario(client: openai.AsyncOpenAI, one: Sim, two: Sim) -> None:
    first = await asyncio.gather(*(_ask(client, "a") for _ in range(8)))
    assert one.loads() + two.loads() == 1, "8 concurrent cold requests must cause one swap"
    assert len({route for _, route in first}) == 1

    second = await asyncio.gather(*(_ask(client, "b") for _ in range(8)))
    assert one.loads() + two.loads() == 2
    assert {route for _, route in second} != {route for _, route in first}, "b on the other one"

    mixed = await asyncio.gather(*(_ask(client, "ab"[i % 2]) for i in range(20)))
    assert one.loads() + two.loads() == 2, "warm models must not swap again"
    assert [model for model, _ in mixed] == ["ab"[i % 2] for i in range(20)]
    routes = dict([*first, *second])
    assert all(route == routes[model] for model, route in mixed)


def test_models_listing_shows_where_models_are_warm(fleet) -> None:
    gw, _, _ = fleet
    with gw.sdk() as client:
        client.chat.completions.create(model="a", messages=MESSAGES, max_tokens=1)
    listing = httpx.get(f"{gw.url}/v1/models").json()["data"]
    by_id = {entry["id"]: entry for entry in listing}
    assert set(by_id) == {"a", "b"}
    assert len(by_id["a"]["swapgate"]["warm_on"]) == 1
    assert by_id["a"]["swapgate"]["served_by"] == ["gpu-a", "gpu-b"]


def test_every_response_says_route_wait_and_request_id(fleet) -> None:
    gw, _, _ = fleet
    response = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "a", "messages": MESSAGES, "max_tokens": 1},
        headers={"x-request-id": "trace-42"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-42"
    assert response.headers["x-swapgate-route"].startswith("instance/gpu-")
    assert int(response.headers["x-swapgate-wait-ms"]) >= 0


def test_completions_and_embeddings_are_routed_too(fleet) -> None:
    gw, _, _ = fleet
    with gw.sdk() as client:
        text = client.completions.create(model="a", prompt="hi", max_tokens=3)
        vectors = client.embeddings.create(model="a", input=["x", "y"])
    assert text.choices[0].text
    assert [len(item.embedding) for item in vectors.data] == [8, 8]


def test_a_killed_instance_fails_over_and_readiness_follows() -> None:
    with simulator(load_time=0.5) as one, simulator(load_time=0.5) as two:
        config = {
            "routing": {"poll_interval": "200ms"},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [instance("gpu-a", one), instance("gpu-b", two)],
        }
        with gateway(config) as gw, gw.sdk() as client:
            raw = client.chat.completions.with_raw_response.create(model="a", messages=MESSAGES)
            warm_on = raw.headers["x-swapgate-route"]
            victim, survivor = (one, two) if warm_on == "instance/gpu-a" else (two, one)
            victim.kill()

            # No other instance has "a" warm: the dead one is out of placement at once, and the
            # request that met its refusal is placed again as a cold one, a swap elsewhere
            # (docs/operations.md, "When part of the fleet breaks"): never a 502.
            raw = client.chat.completions.with_raw_response.create(model="a", messages=MESSAGES)
            assert raw.parse().choices[0].message.content
            assert raw.headers["x-swapgate-route"] != warm_on
            assert survivor.loads() == 1
            assert httpx.get(f"{gw.url}/readyz").status_code == 200

            survivor.kill()
            wait_for(lambda: httpx.get(f"{gw.url}/readyz").status_code == 503)
            with pytest.raises(openai.InternalServerError) as down:
                client.chat.completions.create(model="a", messages=MESSAGES)
            assert down.value.status_code == 503
            assert down.value.response.headers["retry-after"]
            assert "down" in down.value.message

            port = int(victim.url.rsplit(":", 1)[1])
            with simulator(load_time=0.5, port=port):  # the instance comes back
                wait_for(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200)
                answer = client.chat.completions.create(model="a", messages=MESSAGES)
                assert answer.choices[0].message.content


def test_a_connect_failure_is_retried_on_another_warm_instance() -> None:
    with simulator(load_time=0.3) as one, simulator(load_time=0.3) as two:
        for sim in (one, two):  # "a" warm on both before the gateway's first poll
            httpx.get(f"{sim.url}/upstream/a/health", timeout=10).raise_for_status()
        config = {
            "routing": {"poll_interval": "1h"},
            "instances": [instance("gpu-a", one), instance("gpu-b", two)],
        }
        with gateway(config) as gw, gw.sdk() as client:
            one.kill()
            routes = [
                client.chat.completions.with_raw_response.create(
                    model="a", messages=MESSAGES
                ).headers["x-swapgate-route"]
                for _ in range(3)
            ]
            assert routes == ["instance/gpu-b"] * 3
            assert two.loads() == 1, "no swap: the retry went to the warm instance"
            assert (
                'swapgate_upstream_errors_total{instance="gpu-a",kind="connect"} 1.0'
                in gw.metrics()
            )
