"""Each driver against its API's real shapes (llama-swap's /running and /api/models/unload,
Ollama's /api/ps, /api/tags and /api/generate), with respx standing in for the server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import respx

from swapgate.data.warm import WarmState
from swapgate.drivers import llama_swap
from swapgate.drivers.http import control_client
from swapgate.drivers.llama_swap import LlamaSwapDriver
from swapgate.drivers.ollama import OllamaDriver
from swapgate.drivers.openai import OpenAIDriver
from swapgate.drivers.swap_on_request import SwapOnRequestDriver
from swapgate.drivers.vllm_sleep import VllmSleepDriver
from swapgate.errors import DriverError

URL = "http://node:8080"
MODELS = {"object": "list", "data": [{"id": "qwen"}, {"id": "llama"}]}


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as router:
        yield router


async def test_llama_swap_state_reads_running_and_models(api, client) -> None:
    running = [
        {"model": "qwen", "state": "ready", "cmd": "llama-server", "proxy": "", "ttl": 0},
        {"model": "llama", "state": "starting"},
        {"model": "old", "state": "stopping"},
    ]
    api.get("/running").respond(json={"running": running})
    api.get("/v1/models").respond(json=MODELS)
    report = await LlamaSwapDriver(URL, client).state()
    assert report.running == {
        "qwen": WarmState.WARM,
        "llama": WarmState.LOADING,
        "old": WarmState.COLD,
    }
    assert report.available == frozenset({"qwen", "llama"})


@pytest.mark.parametrize("body", [{"models": []}, {"running": "no"}, [1]])
async def test_llama_swap_state_refuses_odd_answers(api, client, body) -> None:
    api.get("/running").respond(json=body)
    with pytest.raises(DriverError, match="/running"):
        await LlamaSwapDriver(URL, client).state()


async def test_llama_swap_loads_through_the_upstream_health_path_with_its_key(api, client) -> None:
    route = api.get("/upstream/qwen/health").respond(text="OK")
    await LlamaSwapDriver(URL, client, api_key="secret").load("qwen")
    assert route.calls.last.request.headers["authorization"] == "Bearer secret"


async def test_llama_swap_load_retries_5xx_then_fails(api, client, monkeypatch) -> None:
    monkeypatch.setattr(llama_swap, "RETRY_PAUSE", 0)
    route = api.get("/upstream/qwen/health").respond(502)
    with pytest.raises(DriverError, match="502"):
        await LlamaSwapDriver(URL, client).load("qwen")
    assert route.call_count == llama_swap.LOAD_ATTEMPTS


async def test_llama_swap_load_waits_out_its_concurrency_limit(api, client) -> None:
    limited = httpx.Response(429, headers={"retry-after": "0"}, json={"error": {"code": "x"}})
    route = api.get("/upstream/qwen/health").mock(side_effect=[limited, httpx.Response(200)])
    await LlamaSwapDriver(URL, client).load("qwen")
    assert route.call_count == 2


async def test_llama_swap_load_refused_for_its_key_is_no_load(api, client) -> None:
    route = api.get("/upstream/qwen/health").respond(401, json={"error": "unauthorized"})
    with pytest.raises(DriverError, match="401"):
        await LlamaSwapDriver(URL, client).load("qwen")
    assert route.call_count == 1


async def test_llama_swap_changes_follow_its_model_status_events_only(api, client) -> None:
    def frame(kind: str, data: str) -> str:
        return "event:message\ndata:" + json.dumps({"type": kind, "data": data}) + "\n\n"

    body = frame("logData", '"loading"') + frame("modelStatus", "[]") + frame("inflight", "{}")
    body += frame("modelStatus", '[{"id": "qwen", "state": "ready"}]')
    api.get("/api/events").respond(text=body, headers={"content-type": "text/event-stream"})
    seen = 0
    async with asyncio.timeout(5):
        async for _ in LlamaSwapDriver(URL, client).changes():
            seen += 1
            if seen == 2:  # one for each modelStatus, none for the others
                break
    assert api.calls.call_count == 1, "both came from the first connection"


async def test_an_instance_without_an_event_stream_is_polled_alone(api, client) -> None:
    api.get("/api/events").respond(404, text="404 page not found")
    assert [c async for c in LlamaSwapDriver(URL, client).changes()] == []


async def test_llama_swap_unloads_one_model(api, client) -> None:
    route = api.post("/api/models/unload/qwen").respond(text="OK")
    await LlamaSwapDriver(URL, client).unload("qwen")
    assert route.called


async def test_older_llama_swap_falls_back_to_unload_everything(api, client) -> None:
    api.post("/api/models/unload/qwen").respond(404, text="404 page")
    fallback = api.get("/unload").respond(text="OK")
    await LlamaSwapDriver(URL, client).unload("qwen")
    assert fallback.called


async def test_an_unreachable_instance_is_a_driver_error(client) -> None:
    with respx.mock(base_url=URL) as api:
        api.get("/running").mock(side_effect=httpx.ConnectError("refused"))
        with pytest.raises(DriverError, match="ConnectError"):
            await LlamaSwapDriver(URL, client).state()


async def test_ollama_state_reads_ps_and_tags(api, client) -> None:
    ps = {
        "models": [{"name": "qwen2.5:7b", "model": "qwen2.5:7b", "size_vram": 5, "expires_at": "x"}]
    }
    tags = {"models": [{"name": "qwen2.5:7b", "model": "qwen2.5:7b"}, {"name": "llama3:8b"}]}
    api.get("/api/ps").respond(json=ps)
    api.get("/api/tags").respond(json=tags)
    report = await OllamaDriver(URL, client).state()
    assert report.running == {"qwen2.5:7b": WarmState.WARM}
    assert report.available == frozenset({"qwen2.5:7b", "llama3:8b"})
    assert report.sizes == {"qwen2.5:7b": 5}  # size_vram: what it really takes (docs/memory.md)


@pytest.mark.parametrize(("verb", "keep_alive"), [("load", -1), ("unload", 0)])
async def test_ollama_loads_and_unloads_with_keep_alive(api, client, verb, keep_alive) -> None:
    route = api.post("/api/generate").respond(json={"done": True, "done_reason": verb})
    await getattr(OllamaDriver(URL, client), verb)("llama3:8b")
    assert json.loads(route.calls.last.request.content) == {
        "model": "llama3:8b",
        "keep_alive": keep_alive,
    }


async def test_ollama_load_failure_is_a_driver_error(api, client) -> None:
    api.post("/api/generate").respond(404, json={"error": "model 'x' not found"})
    with pytest.raises(DriverError, match="404"):
        await OllamaDriver(URL, client).load("x")


async def test_openai_servers_are_warm_with_every_listed_model(api, client) -> None:
    api.get("/v1/models").respond(json=MODELS)
    report = await OpenAIDriver(URL, client).state()
    assert report.running == {"qwen": WarmState.WARM, "llama": WarmState.WARM}


async def test_openai_servers_without_a_model_list_are_warm_while_healthy(api, client) -> None:
    api.get("/v1/models").respond(401)
    api.get("/health").respond(200)
    report = await OpenAIDriver(URL, client).state()
    assert report.all_warm
    assert report.running is None


async def test_openai_servers_that_answer_nothing_are_down(api, client) -> None:
    api.get("/v1/models").respond(500)
    api.get("/health").respond(503)
    driver = OpenAIDriver(URL, client)
    with pytest.raises(DriverError):  # the poller counts it as a failed poll
        await driver.state()


async def test_swap_on_request_tracks_nothing_and_warms_with_one_token(api, client) -> None:
    api.get("/v1/models").respond(json=MODELS)
    route = api.post("/v1/chat/completions").respond(json={"choices": []})
    driver = SwapOnRequestDriver(URL, client)
    report = await driver.state()
    assert report.running is None
    assert report.available == frozenset({"qwen", "llama"})
    await driver.load("qwen")
    sent = json.loads(route.calls.last.request.content)
    assert (sent["model"], sent["max_tokens"]) == ("qwen", 1)


async def test_instances_with_listed_models_are_not_asked_for_their_model_list(api, client) -> None:
    api.get("/running").respond(json={"running": []})
    api.get("/api/ps").respond(json={"models": []})
    listing = api.get("/v1/models").respond(json=MODELS)
    tags = api.get("/api/tags").respond(json={"models": []})
    assert (await LlamaSwapDriver(URL, client, discover=False).state()).available is None
    assert (await OllamaDriver(URL, client, discover=False).state()).available is None
    assert not listing.called
    assert not tags.called


SLEEPY = {"a": "http://10.0.0.7:8001", "b": "http://10.0.0.7:8002"}


async def test_vllm_sleep_state_reads_each_servers_is_sleeping(client) -> None:
    with respx.mock(assert_all_called=False) as router:
        await _sleep_states(router, client)


async def _sleep_states(router: respx.MockRouter, client: httpx.AsyncClient) -> None:
    router.get(f"{SLEEPY['a']}/is_sleeping").respond(json={"is_sleeping": False})
    router.get(f"{SLEEPY['b']}/is_sleeping").respond(json={"is_sleeping": True})
    driver = VllmSleepDriver(SLEEPY, 1, client)
    report = await driver.state()
    assert report.running == {"a": WarmState.WARM, "b": WarmState.ASLEEP}
    assert driver.model_url("b") == SLEEPY["b"]
    assert driver.evicts_to is WarmState.ASLEEP
    router.get(f"{SLEEPY['b']}/is_sleeping").mock(side_effect=httpx.ConnectError("down"))
    assert (await driver.state()).running == {"a": WarmState.WARM}, "the other one: cold"
    router.get(f"{SLEEPY['a']}/is_sleeping").respond(404)  # no VLLM_SERVER_DEV_MODE
    with pytest.raises(DriverError, match="no vLLM server of this instance answers"):
        await driver.state()


async def test_vllm_sleep_wakes_and_sleeps_at_its_level(client) -> None:
    with respx.mock(assert_all_called=False) as router:
        await _wakes(router, client)


async def _wakes(router: respx.MockRouter, client: httpx.AsyncClient) -> None:
    """Level 2 dropped the weights: the wake brings their memory back, reloads them from disk,
    then wakes the rest; the sleep waits for what the server answers (``mode=wait``)."""
    router.post(f"{SLEEPY['a']}/wake_up", params={"tags": "weights"}).respond(
        200, json={"status": "sleeping", "tags": ["weights"]}
    )
    router.post(f"{SLEEPY['a']}/collective_rpc", json={"method": "reload_weights"}).respond(200)
    wake = router.post(f"{SLEEPY['a']}/wake_up").respond(200, json={"status": "awake"})
    router.get(f"{SLEEPY['a']}/is_sleeping").mock(
        side_effect=[
            httpx.Response(200, json={"is_sleeping": True}),
            httpx.Response(200, json={"is_sleeping": False}),
        ]
    )
    sleep = router.post(f"{SLEEPY['b']}/sleep", params={"level": "2", "mode": "wait"}).respond(
        200, json={"status": "sleeping", "level": 2}
    )
    driver = VllmSleepDriver(SLEEPY, 2, client)
    await driver.load("a")
    await driver.unload("b")
    asked = [
        f"{c.request.method} {c.request.url.path}?{c.request.url.query.decode()}"
        for c in router.calls
    ]
    assert asked == [
        "GET /is_sleeping?",
        "POST /wake_up?tags=weights",
        "POST /collective_rpc?",
        "POST /wake_up?",
        "GET /is_sleeping?",
        "POST /sleep?level=2&mode=wait",
    ]
    assert wake.call_count == 1
    assert sleep.call_count == 1
    router.get(f"{SLEEPY['b']}/is_sleeping").respond(200, json={"is_sleeping": True})
    router.post(f"{SLEEPY['b']}/wake_up").respond(500)
    with pytest.raises(DriverError, match="answered 500"):
        await driver.load("b")
    with pytest.raises(DriverError, match="no vLLM server for 'c'"):
        await driver.load("c")


async def test_a_connection_the_server_closed_is_tried_once_more(api) -> None:
    route = api.post("/api/models/unload/qwen").mock(
        side_effect=[httpx.RemoteProtocolError("Server disconnected"), httpx.Response(200)]
    )
    async with control_client() as client:
        await LlamaSwapDriver(URL, client).unload("qwen")
    assert route.call_count == 2
