"""``kind: llama-router`` against the shapes of llama-server's router API (llama.cpp b11434:
``/models``, ``/models/load``, ``/models/unload``, ``/models/sse``, ``/props``), with respx
standing in for the server. The real router is met in tests/engine/test_llama_server.py."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from swapgate.data.warm import WarmState
from swapgate.drivers import llama_router
from swapgate.drivers.llama_router import LlamaRouterDriver
from swapgate.errors import DriverError

URL = "http://router:8080"
NOT_RUNNING = {"error": {"code": 400, "message": "model is not running"}}
ALREADY = {"error": {"code": 400, "message": "model is already running"}}
LIMIT = {"error": {"code": 500, "message": "model limit reached, try again later"}}


def models(**states: str | dict[str, Any]) -> dict[str, Any]:
    data = []
    for name, status in states.items():
        status = {"value": status} if isinstance(status, str) else status
        data.append({"id": name, "object": "model", "status": status})
    return {"object": "list", "data": data}


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_router, "STATUS_PAUSE", 0.0)


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as router:
        router.get("/props").respond(json={"role": "router", "max_instances": 2})
        yield router


async def test_state_maps_each_status_and_takes_the_routers_limit(api, client) -> None:
    failed = {"value": "unloaded", "failed": True, "exit_code": 1}
    api.get("/models").respond(
        json=models(a="loaded", b="loading", c="sleeping", d="unloaded", e=failed)
    )
    report = await LlamaRouterDriver(URL, client).state()
    assert report.running == {"a": WarmState.WARM, "b": WarmState.LOADING, "c": WarmState.ASLEEP}
    assert report.available == frozenset("abcde")
    assert report.capacity == 2


async def test_a_router_without_a_limit_reports_none(api, client) -> None:
    api.get("/props").respond(json={"role": "router", "max_instances": 0})
    api.get("/models").respond(json=models(a="loaded"))
    assert (await LlamaRouterDriver(URL, client).state()).capacity is None


async def test_load_posts_and_waits_until_loaded(api, client) -> None:
    load = api.post("/models/load").respond(json={"success": True})
    status = api.get("/models").mock(
        side_effect=[
            httpx.Response(200, json=models(a="loading")),
            httpx.Response(200, json=models(a="loading")),
            httpx.Response(200, json=models(a="loaded")),
        ]
    )
    await LlamaRouterDriver(URL, client).load("a")
    assert load.calls.last.request.content == b'{"model":"a"}'
    assert status.call_count == 3  # asked until it said loaded


async def test_already_running_is_a_success(api, client) -> None:
    api.post("/models/load").respond(400, json=ALREADY)
    api.get("/models").respond(json=models(a="loaded"))
    await LlamaRouterDriver(URL, client).load("a")


async def test_a_load_whose_child_exits_fails_with_its_exit_code(api, client) -> None:
    api.post("/models/load").respond(json={"success": True})
    failed = {"value": "unloaded", "failed": True, "exit_code": 134}
    api.get("/models").mock(
        side_effect=[
            httpx.Response(200, json=models(a="loading")),
            httpx.Response(200, json=models(a=failed)),
        ]
    )
    with pytest.raises(DriverError, match=r"exited with SIGABRT \(exit code 134\) while loading"):
        await LlamaRouterDriver(URL, client).load("a")


async def test_unload_waits_until_the_child_has_exited(api, client) -> None:
    unload = api.post("/models/unload").respond(json={"success": True})
    # The router says "loaded" until the stopping child exits: only then is its place free.
    answers = [models(a="loaded")] * 3 + [models(a="unloaded")]
    status = api.get("/models").mock(side_effect=[httpx.Response(200, json=a) for a in answers])
    await LlamaRouterDriver(URL, client).unload("a")
    assert unload.called
    assert status.call_count == 4


async def test_not_running_is_a_success(api, client) -> None:
    api.post("/models/unload").respond(400, json=NOT_RUNNING)
    api.get("/models").respond(json=models(a="unloaded"))
    await LlamaRouterDriver(URL, client).unload("a")


async def test_a_child_that_never_stops_is_a_driver_error(api, client, monkeypatch) -> None:
    monkeypatch.setattr(llama_router, "STOP_WAIT", 0.05)
    api.post("/models/unload").respond(json={"success": True})
    api.get("/models").respond(json=models(a="loaded"))
    with pytest.raises(DriverError, match="still runs"):
        await LlamaRouterDriver(URL, client).unload("a")


async def test_a_full_router_first_stops_the_children_it_put_to_sleep(api, client) -> None:
    loads = iter([httpx.Response(500, json=LIMIT), httpx.Response(200, json={"success": True})])
    api.post("/models/load").mock(side_effect=lambda request: next(loads))
    unload = api.post("/models/unload").respond(json={"success": True})
    states = itertools.chain(
        [models(a="sleeping", b="unloaded")] * 1,  # which ones sleep
        [models(a="unloaded", b="unloaded")] * 1,  # a stopped
        itertools.repeat(models(a="unloaded", b="loaded")),
    )
    api.get("/models").mock(side_effect=lambda request: httpx.Response(200, json=next(states)))
    await LlamaRouterDriver(URL, client).load("b")
    assert unload.calls.last.request.content == b'{"model":"a"}'


async def test_other_load_errors_are_driver_errors(api, client) -> None:
    api.post("/models/load").respond(400, json={"error": {"message": "model is not found"}})
    with pytest.raises(DriverError, match="not found"):
        await LlamaRouterDriver(URL, client).load("zzz")


async def test_changes_yield_at_each_event_of_the_routers_stream(api, client) -> None:
    events = (
        b'data: {"model":"a","event":"model_status","data":{"status":"loading"}}\n\n'
        b'data: {"model":"a","event":"status_change","data":{"status":"loaded"}}\n\n'
    )
    api.get("/models/sse").respond(headers={"content-type": "text/event-stream"}, content=events)
    seen = 0
    async for _ in LlamaRouterDriver(URL, client).changes():
        seen += 1
        if seen == 2:
            break
    assert seen == 2


async def test_the_load_stages_the_router_announces_are_kept_while_it_loads(api, client) -> None:
    """Events as the router writes them on /models/sse (tools/server/server-models.cpp)."""
    events = [
        {"model": "a", "event": "model_status", "data": {"status": "loading"}},
        {
            "model": "a",
            "event": "status_change",
            "data": {
                "status": "loading",
                "progress": {
                    "stages": ["text_model", "mmproj_model"],
                    "current": "text_model",
                    "value": 0.42,
                },
            },
        },
        {
            "model": "a",
            "event": "status_change",
            "data": {"status": "loading", "progress": {"stage": "mmproj_model"}},
        },
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    api.get("/models/sse").respond(text=body, headers={"content-type": "text/event-stream"})
    driver = LlamaRouterDriver(URL, client)
    heard = driver.changes()
    for _ in events:
        await anext(heard)
    stage = driver.load_stage("a")
    assert stage is not None
    assert (stage.number, stage.count, stage.name, stage.value) == (1, 2, "text_model", 0.42)
    driver._heard({"model": "a", "event": "status_change", "data": {"status": "loaded"}})
    assert driver.load_stage("a") is None, "loaded: no stage"
    await heard.aclose()  # type: ignore[attr-defined]
