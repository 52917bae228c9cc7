"""What one client connection may cost the gateway (docs/operations.md): the bytes of its headers,
the time it takes to send its request, and how many connections are open at once.

uvicorn bounds none of these under httptools: a client may send endless headers, a byte at a
time, on as many connections as it likes. ``GuardedProtocol`` is uvicorn's HTTP protocol with
the three bounds added where the bytes arrive, so a refused request never reaches the app and
nothing of it goes upstream. Responses are not bounded here: an answer may stream for hours.

- headers: at most ``max_header_bytes`` from a request's first byte to the end of its headers
  (request line included, as nginx counts) → 431, counted before the parser buffers more;
- time: a request, body included, must arrive within ``request_read_timeout`` of its first
  byte (of the connection's opening, for the first one) → 408. An idle connection between
  requests is uvicorn's keep-alive timeout's, as before;
- connections: past ``max_connections``, each request on a new connection is answered 503
  and the connection closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from swapgate.errors import (
    BadRequest,
    HeadersTooLarge,
    RequestTimeout,
    SwapgateError,
    TooManyConnections,
)
from swapgate.proxy.handler import TIMED_OUT
from swapgate.proxy.writer import ON_DISCONNECT, Disconnect

log = logging.getLogger("swapgate.access")

LINGER = 2.0  # seconds a refused connection drains what the client still sends
# A scope extension set on the requests in flight when the server begins to stop.
SHUTTING_DOWN = "swapgate.shutting_down"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_header_bytes: int
    request_read_timeout: float
    max_connections: int
    # Told of every request refused before the app saw it (metrics); the log line is ours.
    refused: Callable[[SwapgateError], None] = lambda error: None


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""

    class Limited(GuardedProtocol):
        LIMITS = limits

    return Limited


class GuardedProtocol(HttpToolsProtocol):
    LIMITS: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_room: int | None = self.LIMITS.max_header_bytes  # None: headers are in
        self._read_timer: asyncio.TimerHandle | None = None
        self._draining = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.LIMITS.max_connections:
            busy = TooManyConnections(
                f"swapgate has server.max_connections ({self.LIMITS.max_connections}) client "
                "connections open; retry shortly, or reuse a connection",
                retry_after=1,
            )
            self.app = _answer(busy, self._refused)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            _tell_disconnect(cast(Scope, cycle.scope))

    def shutdown(self) -> None:
        """The server stops: an answer that never ends by itself (the dashboard's event
        stream) sees it in its scope and ends, instead of holding the stop for
        ``shutdown_grace``."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope.setdefault("extensions", {})[SHUTTING_DOWN] = {}
        super().shutdown()

    def data_received(self, data: bytes) -> None:
        if self._draining:
            return  # answered and closing: the rest of the request is discarded
        room = self._header_room
        if room is not None and len(data) > room:
            # Feed only what the headers may still take; more while they are unfinished is 431.
            super().data_received(data[:room])
            if self._header_room is not None and not self._finished:
                limit = self.LIMITS.max_header_bytes
                self._refuse(
                    HeadersTooLarge(
                        f"the request's headers exceed server.max_header_bytes ({limit} bytes); "
                        "send fewer or shorter headers"
                    )
                )
                return
            data = data[room:]
        elif room is not None:
            self._header_room = room - len(data)
        if data and not self._finished:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP, OpenAI-shaped like every other error."""
        self._refuse(BadRequest(f"{msg} Send an HTTP/1.1 request."))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._header_room = None
        super().on_headers_complete()
        # The endpoint is told of its client's going away, and needs no task listening
        cast(Scope, self.cycle.scope)[ON_DISCONNECT] = Disconnect()

    def on_message_complete(self) -> None:
        self._disarm()
        self._header_room = self.LIMITS.max_header_bytes
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not self.pipeline:
            # Read on, as the endpoint's receive() would: a client that goes away is seen
            # even after a large body paused reading. Requests pipelined behind one still
            # answering stay paused, as uvicorn has them.
            self.flow.resume_reading()

    @property
    def _finished(self) -> bool:
        return self._draining or self.transport.is_closing()

    def _arm(self) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(
            self.LIMITS.request_read_timeout, self._read_timed_out
        )

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self._arm()  # a pipelined request waits behind an answer: look again later
            return
        timeout = RequestTimeout(
            f"the request did not arrive within server.request_read_timeout "
            f"({self.LIMITS.request_read_timeout:g}s); send it whole, faster"
        )
        if self._header_room is None and cycle is not None and not cycle.response_complete:
            # The app has the request and waits for its body: it sees the client gone, and
            # counts the request as timed out.
            cycle.scope.setdefault("extensions", {})[TIMED_OUT] = {}
            cycle.disconnected = True
            cycle.message_event.set()
            _tell_disconnect(cast(Scope, cycle.scope))
            self._write(timeout)
            log.warning("%s: %s", _peer(self.client), timeout.message)
        else:
            self._refuse(timeout)

    def _refuse(self, error: SwapgateError) -> None:
        """Answer a request the app never saw, and close the connection."""
        self._write(error)
        self._refused(error)

    def _refused(self, error: SwapgateError) -> None:
        log.warning("%s: %d %s: %s", _peer(self.client), error.status, error.code, error.message)
        self.LIMITS.refused(error)

    def _write(self, error: SwapgateError) -> None:
        if self._finished:
            return
        body = error.body()
        head = [f"HTTP/1.1 {error.status} {_REASONS[error.status]}".encode()]
        head += [name + b": " + value for name, value in error.headers()]
        head += [b"content-length: " + str(len(body)).encode(), b"connection: close"]
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self._linger()

    def _linger(self) -> None:
        """Close gently, as nginx's lingering close does: closing a socket with unread bytes in
        it sends a reset, which can destroy the answer before the client reads it. So: send
        FIN after the answer, discard what still arrives, close at the client's FIN or after
        ``LINGER`` seconds."""
        self._draining = True
        self._disarm()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.loop.call_later(LINGER, self.transport.close)

    def eof_received(self) -> None:
        if self._draining:
            self.transport.close()


_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _answer(
    error: SwapgateError, refused: Callable[[SwapgateError], None]
) -> Callable[[Scope, Receive, Send], Any]:
    """An ASGI app that answers every request with ``error`` and closes the connection."""

    body = error.body()
    headers = [
        *error.headers(),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        refused(error)

    return app


def _tell_disconnect(scope: Scope) -> None:
    on_disconnect = scope.get(ON_DISCONNECT)
    if on_disconnect is not None:
        on_disconnect()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
