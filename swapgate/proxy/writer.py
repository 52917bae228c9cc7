"""The response written, at the ASGI level: ``ResponseWriter`` remembers how far it got and how
its mode tells a failure; ``until_disconnect`` cancels the work of a client that went away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

from starlette.types import Receive, Send

from swapgate.errors import SwapgateError
from swapgate.proxy.endpoints import OPENAI, Dialect

# What the body sent so far is, which decides how a failure can still be told (``fail``):
# keep-alives alone ("pings": SSE comments or reasoning chunks; "whitespace"), or the
# upstream's own body under way ("events": a stream; "body": anything else).
BodyMode = Literal["pings", "whitespace", "events", "body"]
# Enough of a stream's latest bytes to hold any dialect's last-event mark (``Dialect.last_event``)
_LAST_EVENT_SPAN = 32


class ResponseWriter:
    """Sends one ASGI response, remembers how far it got, and tells a failure the one way
    that is still possible (docs/architecture.md, docs/operations.md)."""

    def __init__(
        self, send: Send, headers: list[tuple[bytes, bytes]], dialect: Dialect = OPENAI
    ) -> None:
        self._send = send
        self.headers = headers  # swapgate's own, added to whatever status goes out
        self.dialect = dialect
        self.status = 0
        self.ended = False
        self._last_event_out = False  # an event stream's last event went out, whole
        self.mode: BodyMode | None = None
        # Run before the answer's end goes out (``hold_end``), and the bytes held back for it
        self._before_end: Callable[[], Awaitable[None]] | None = None
        self._held = b""
        self._seen = b""  # the latest bytes of the stream, for a last event split in two

    @property
    def started(self) -> bool:
        return self.status != 0

    @property
    def answered_in_full(self) -> bool:
        """Whether the client has its whole answer: a client that hangs up now lost nothing.
        An event stream is whole once its last event is out, before the upstream closes it."""
        return self.ended or self._last_event_out

    async def start(
        self, status: int, headers: list[tuple[bytes, bytes]], mode: BodyMode = "body"
    ) -> None:
        await self._send(
            {"type": "http.response.start", "status": status, "headers": headers + self.headers}
        )
        self.status = status  # only once sent: a start cancelled before it went out never counts
        self.mode = mode

    def upstream_body(self, event_stream: bool) -> None:
        """The upstream's body follows the keep-alives from here on."""
        self.mode = "events" if event_stream else "body"

    def hold_end(self, before_end: Callable[[], Awaitable[None]]) -> None:
        """Send the answer's end only once ``before_end`` is done: its key settled (tokens
        counted, slot back), so that the client's next request, to any replica, sees it. The
        end is what a client takes as the answer whole: a body's last chunk (its length may be
        known), an event stream's last event. So the body holds back its latest chunk, and an
        event stream each chunk that carries its last event; every other chunk goes out as it
        comes."""
        self._before_end = before_end

    async def write(self, chunk: bytes) -> None:
        if self._before_end is not None and self.mode in ("events", "body"):
            chunk = self._hold(chunk)
            if not chunk:
                return
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        last = self.dialect.last_event
        if self.mode == "events" and chunk.endswith(self.dialect.event_end) and last.search(chunk):
            self._last_event_out = True

    def _hold(self, chunk: bytes) -> bytes:
        """What goes out now of what was held and ``chunk``; the rest waits for the end. A
        last event split across chunks is found with the end of the chunks before it."""
        out, self._held = self._held, b""
        seen = self._seen + chunk
        self._seen = seen[-_LAST_EVENT_SPAN:]
        if self.mode == "body" or self.dialect.last_event.search(seen):
            self._held = chunk
            return out
        return out + chunk

    async def end(self, chunk: bytes = b"") -> None:
        if self._before_end is not None:
            before_end, self._before_end = self._before_end, None
            await before_end()
            chunk, self._held = self._held + chunk, b""
        await self._send({"type": "http.response.body", "body": chunk, "more_body": False})
        self.ended = True

    async def error(self, exc: SwapgateError) -> None:
        await self.start(exc.status, exc.headers())
        await self.end(self.dialect.error_body(exc))

    async def fail(self, exc: SwapgateError) -> None:
        """Tell ``exc`` in the client's dialect: as the status if none went out; after SSE, as
        one error event; after whitespace, as the error object, left unended. A body left
        unended (that one, or the upstream's half sent) makes the ASGI server cut the
        connection: never a short body that looks whole. After whitespace that cut is what
        makes every SDK raise (a connection error) where a whole 200 would be read as an empty
        answer; a plain client still reads the error object before it."""
        if not self.started:
            await self.error(exc)
            return
        self._before_end = None  # what was held goes out before the failure is told
        held, self._held = self._held, b""
        if self.mode == "body":
            return
        with contextlib.suppress(Exception):  # the client may be gone too
            if held:
                await self.write(held)
            if self.mode == "whitespace":
                await self.write(self.dialect.error_body(exc))
            else:
                await self.end(self.dialect.error_event(exc))


# Where a server that tells the endpoint of a disconnect itself puts its ``Disconnect`` in each
# request's scope (swapgate/server/connections.py).
ON_DISCONNECT = "swapgate.on_disconnect"


class Disconnect:
    """Called by the server when a request's client goes away before its answer ended."""

    __slots__ = ("callback", "told")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.told = False  # it went away, perhaps before anyone listened

    def __call__(self) -> None:
        self.told = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


async def until_disconnect(
    receive: Receive, work: Coroutine[Any, Any, None], told: Disconnect | None = None
) -> None:
    """Run ``work`` in this task; a client that disconnects first cancels it.

    A server that tells of the disconnect itself (``told``, swapgate's own) costs no task:
    ~10 µs a request on the warm path. Any other ASGI server gets one watcher task, which
    listens on ``receive`` and cancels the request's own task.
    """
    current = asyncio.current_task()
    assert current is not None
    state = {"done": False, "gone": False}

    def went_away() -> None:
        if not state["done"]:
            state["gone"] = True
            current.cancel()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        went_away()

    watcher = None
    if told is not None:
        if told.told:
            work.close()
            raise ConnectionAbortedError("the client went away")
        told.callback = went_away
    else:
        watcher = asyncio.create_task(watch())
    try:
        await work
    except asyncio.CancelledError:
        if not state["gone"]:
            raise
        current.uncancel()
        raise ConnectionAbortedError("the client went away") from None
    finally:
        state["done"] = True
        if told is not None:
            told.callback = None
        if watcher is not None:
            watcher.cancel()
