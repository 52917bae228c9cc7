"""A fault of swapgate's own on the request path still ends the answer as every other failure
does (docs/operations.md): a shaped 500 with the request id before any byte went out; after
early headers, the error event of the endpoint's dialect or the error object after the
whitespace. Counted in swapgate_internal_errors_total, with the traceback in the log.

The gateway runs in this process, served by uvicorn over a real socket with swapgate's own
connection protocol, so that what a client reads is what a client would read."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import uvicorn

from swapgate.config.loading import parse_config
from swapgate.control.routing.router import Router
from swapgate.data.lease import Lease
from swapgate.server.app import SwapgateApp, create_app
from swapgate.server.connections import guarded_protocol
from swapgate.server.serve import connection_limits
from tests.unit.fakes import eventually

BUG = "max() arg is an empty sequence"
CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {**CHAT, "max_tokens": 8}
RESPONSES = {"model": "a", "input": "hi"}


def fail_acquire(monkeypatch: pytest.MonkeyPatch, after: float) -> None:
    """The router fails with a bug of ours ``after`` seconds into each request: past
    ``early_headers_after`` (0.05 s here), or before it."""

    async def broken(self: Router, model: str, *args: Any, **kwargs: Any) -> Lease:
        await asyncio.sleep(after)
        raise ValueError(BUG)

    monkeypatch.setattr(Router, "acquire", broken)


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[str, SwapgateApp]]:
    config = {
        # Nothing listens there: the request never gets as far as an instance
        "instances": [{"name": "gpu-a", "url": "http://127.0.0.1:9", "models": ["a"]}],
        "keepalive": {"early_headers_after": 0.05, "interval": 0.05},
        "server": {"access_log": False},
    }
    settings = parse_config(config)
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            http=guarded_protocol(connection_limits(settings.server, app)),
            log_config=None,
        )
    )
    serving = asyncio.create_task(server.serve())
    assert await eventually(lambda: server.started, within=10)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        await serving


async def _read(url: str, body: dict[str, Any]) -> tuple[int, str, bytes, bool]:
    """Status, request id, the body read, and whether the body ended whole."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        read = b""
        try:
            async for chunk in response.content.iter_any():
                read += chunk
        except aiohttp.ClientPayloadError:
            return response.status, response.headers["x-request-id"], read, False
        return response.status, response.headers["x-request-id"], read, True


def _internal_errors(app: SwapgateApp) -> float:
    value = app.runtime.metrics.registry.get_sample_value(
        "swapgate_internal_errors_total", {"where": "request"}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("path", "body", "event"),
    [
        ("/v1/chat/completions", CHAT, b"data: "),
        ("/v1/messages", MESSAGES, b"event: error\ndata: "),
        ("/v1/responses", RESPONSES, b"event: error\ndata: "),
    ],
)
async def test_after_early_headers_a_stream_ends_with_the_error_event_of_its_dialect(
    gateway: tuple[str, SwapgateApp],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict[str, Any],
    event: bytes,
) -> None:
    url, app = gateway
    fail_acquire(monkeypatch, 0.3)
    with caplog.at_level(logging.ERROR):
        status, request_id, read, whole = await _read(url + path, {**body, "stream": True})
    assert status == 200, "the early headers went out before the fault"
    assert whole, "the stream ends, never cut short"
    last = read.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(event), read
    error = json.loads(last.split(b"data: ", 1)[1])["error"]
    assert request_id in (error.get("message") or ""), error
    assert BUG not in read.decode(), "the cause is for the log, not the client"
    assert _internal_errors(app) == 1
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.exc_info is not None, "the traceback is in the log"
    assert BUG in str(record.exc_info[1])


async def test_after_early_headers_an_answer_is_the_error_object_after_the_whitespace(
    gateway: tuple[str, SwapgateApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = gateway
    fail_acquire(monkeypatch, 0.3)
    status, request_id, read, whole = await _read(url + "/v1/chat/completions", CHAT)
    assert status == 200
    assert read.startswith(b"\n"), "whitespace kept the connection alive first"
    error = json.loads(read)["error"]  # JSON allows the leading whitespace
    assert error["code"] == "internal_error"
    assert request_id in error["message"]
    # As for every failure after whitespace: the cut makes every SDK raise, where a whole 200
    # would be read as an empty answer (docs/operations.md)
    assert not whole
    assert _internal_errors(app) == 1


async def test_before_any_byte_it_is_a_shaped_500_with_the_request_id(
    gateway: tuple[str, SwapgateApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = gateway
    fail_acquire(monkeypatch, 0.0)
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)):
        status, request_id, read, whole = await _read(url + path, {**body, "stream": True})
        assert (status, whole) == (500, True)
        error = json.loads(read)["error"]
        assert request_id in error["message"]
        assert BUG not in read.decode()
    assert _internal_errors(app) == 2
