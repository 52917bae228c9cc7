"""swapgate's HTTP protocol (swapgate/server/connections.py) on its own, as uvicorn tests its
protocols: a transport that records what is written, bytes fed as a client would send them.

The protocol subclasses uvicorn's httptools protocol and reads some of its internals (why, in
docs/architecture.md); these tests pin what it adds — the bounds on headers, read time and
connections, answers the app never saw, pipelined requests, the endpoint told of a client that
went away — so that a uvicorn release that moves those internals fails here first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from swapgate.errors import SwapgateError
from swapgate.proxy.writer import ON_DISCONNECT, Disconnect
from swapgate.server.connections import ConnectionLimits, GuardedProtocol, guarded_protocol
from tests.unit.fakes import eventually

App = Callable[[Scope, Receive, Send], Awaitable[None]]
GET = b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n"


class RecordingTransport(asyncio.Transport):
    """What the protocol writes, and whether it closed, paused or resumed reading."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.eof = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, answers with its length."""
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Connections:
    """Connections to one server's protocol class, sharing its state, as uvicorn's are."""

    def __init__(self, app: App, refused: list[SwapgateError], **limits: Any) -> None:
        settings = {"max_header_bytes": 1024, "request_read_timeout": 5.0, "max_connections": 8}
        self.limits = ConnectionLimits(**{**settings, **limits}, refused=refused.append)
        self.protocol_class = guarded_protocol(self.limits)
        self.config = Config(app=app, lifespan="off", ws="none", log_config=None)
        self.state = ServerState()

    def open(self) -> tuple[GuardedProtocol, RecordingTransport]:
        protocol = self.protocol_class(config=self.config, server_state=self.state, app_state={})
        assert isinstance(protocol, GuardedProtocol)
        transport = RecordingTransport()
        protocol.connection_made(transport)
        return protocol, transport


def responses(written: bytes) -> list[tuple[int, bytes]]:
    """Each answer's status and body, in order (content-length framed)."""
    found = []
    while written:
        head, _, rest = written.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        found.append((status, rest[:length]))
        written = rest[length:]
    return found


async def test_a_request_is_served_and_its_scope_carries_the_disconnect() -> None:
    scopes: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scopes.append(scope)
        await hello(scope, receive, send)

    protocol, transport = Connections(app, []).open()
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello")
    assert await eventually(lambda: bool(responses(transport.written)))
    assert responses(transport.written) == [(200, b"5")]
    assert isinstance(scopes[0][ON_DISCONNECT], Disconnect)


async def test_pipelined_requests_are_answered_in_order() -> None:
    protocol, transport = Connections(hello, []).open()
    second = b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\n\r\nabc"
    protocol.data_received(GET + second + GET)
    assert await eventually(lambda: len(responses(transport.written)) == 3)
    assert responses(transport.written) == [(200, b"0"), (200, b"3"), (200, b"0")]
    assert not transport.closed


async def test_headers_past_their_bound_are_431_and_the_app_never_sees_them() -> None:
    seen: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)

    refused: list[SwapgateError] = []
    protocol, transport = Connections(app, refused, max_header_bytes=200).open()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * 300)
    ((status, body),) = responses(transport.written)
    assert status == 431
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert transport.eof, "a lingering close: FIN after the answer, not a reset"
    assert [e.status for e in refused] == [431]
    protocol.data_received(b"more bytes after the refusal are discarded\r\n\r\n")
    await asyncio.sleep(0)
    assert seen == []


async def test_a_client_too_slow_to_send_its_request_gets_408() -> None:
    refused: list[SwapgateError] = []
    protocol, transport = Connections(hello, refused, request_read_timeout=0.05).open()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: g")
    assert await eventually(lambda: bool(transport.written))
    ((status, body),) = responses(transport.written)
    assert status == 408
    assert "request_read_timeout" in json.loads(body)["error"]["message"]
    assert [e.status for e in refused] == [408]


async def test_past_max_connections_a_new_connection_is_answered_503_and_closed() -> None:
    refused: list[SwapgateError] = []
    server = Connections(hello, refused, max_connections=1)
    first, _ = server.open()
    second, transport = server.open()
    second.data_received(GET)
    assert await eventually(lambda: bool(responses(transport.written)))
    ((status, body),) = responses(transport.written)
    assert status == 503
    assert b"retry-after: 1" in transport.written.lower()
    assert json.loads(body)["error"]["code"] == "no_capacity"
    assert [e.status for e in refused] == [503]
    first.data_received(GET)  # the connections within the bound are served as ever


async def test_bytes_that_are_not_http_get_a_shaped_400() -> None:
    protocol, transport = Connections(hello, []).open()
    protocol.data_received(b"\x16\x03\x01 a TLS hello to a plain port\r\n\r\n")
    ((status, body),) = responses(transport.written)
    assert status == 400
    assert "HTTP/1.1" in json.loads(body)["error"]["message"]


async def test_the_endpoint_is_told_when_its_client_goes_away_mid_answer() -> None:
    told = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        scope[ON_DISCONNECT].callback = told.set
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(5)  # a long answer, cut short by the client

    protocol, transport = Connections(app, []).open()
    protocol.data_received(GET)
    assert await eventually(lambda: transport.written.startswith(b"HTTP/1.1 200"))
    protocol.connection_lost(None)
    await asyncio.wait_for(told.wait(), 1)


async def test_after_a_large_body_reading_resumes_to_see_the_client_leave() -> None:
    """uvicorn pauses reading past 64 KiB of body until the app receives it; an endpoint
    that answers without listening would never see its client go. Reading resumes at the
    body's end, unless requests are pipelined behind (they stay paused)."""
    answered = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await answered.wait()

    protocol, transport = Connections(app, []).open()
    body = b"x" * (256 * 1024)
    head = b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n" % len(body)
    protocol.data_received(head + body[:100_000])
    assert not transport.reading, "uvicorn paused reading past its high-water mark"
    protocol.data_received(body[100_000:])
    assert transport.reading, "the body is whole: read on"
    protocol.data_received(GET)  # pipelined behind the unanswered one
    assert not transport.reading
    answered.set()


@pytest.mark.parametrize("limit", [1, 3])
def test_each_server_gets_its_own_limits(limit: int) -> None:
    limits = ConnectionLimits(1024, 5.0, limit)
    assert guarded_protocol(limits).LIMITS.max_connections == limit
