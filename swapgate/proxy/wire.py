"""The wire of the data plane, at the ASGI level: which headers travel, the JSON body read,
and the response written (``ResponseWriter``: how its mode tells a failure)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Coroutine, Sequence
from typing import Any, Literal

from starlette.types import Receive, Send

from swapgate.errors import BadRequest, RequestTooLarge, SwapgateError
from swapgate.proxy.endpoints import OPENAI, Dialect

# Never forwarded (docs/compatibility.md, "Headers", says which engine each one matters to):
# hop-by-hop headers; every credential a client library sends (docs/architecture.md); what swapgate
# sets itself (the body's length and type, the request id); ``accept-encoding``, since keep-alive
# bytes written before a compressed body would corrupt it; ``origin``, which Ollama answers with 403
# unless it is on OLLAMA_ORIGINS; and vLLM's client-chosen data-parallel rank. Bytes, as ASGI gives
# header names (lower-case): filtering decodes only what is kept.
DROP_REQUEST = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
        b"transfer-encoding", b"upgrade", b"host", b"content-length", b"content-type",
        b"x-request-id", b"accept-encoding", b"authorization", b"proxy-authorization",
        b"x-api-key", b"api-key", b"cookie", b"origin", b"x-data-parallel-rank",
    }
)  # fmt: skip
# Also what swapgate sets itself, so a client never gets it twice: the upstream's echo of
# ``x-request-id`` (llama-cpp-python, vLLM) and ``x-accel-buffering`` (llama.cpp, llama-swap).
DROP_RESPONSE = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-connection", b"te",
        b"trailer", b"transfer-encoding", b"upgrade", b"date", b"server", b"x-request-id",
        b"x-accel-buffering",
    }
)  # fmt: skip


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("the client went away while sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(
                f"the request body exceeds server.max_body_bytes ({limit} bytes); send less"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_request(body: bytes) -> tuple[dict[str, Any], str, bool]:
    """The JSON object, its ``model`` and whether it asks for a stream."""
    try:
        payload = json.loads(body, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply to parse; send a flatter object") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object with a 'model' field")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is missing or not a string; name the model", param="model")
    return payload, model, payload.get("stream") is True


def _not_json(constant: str) -> None:
    # Python's json reads NaN and Infinity; JSON has neither, and engines reject them (or
    # worse, take them): a 400 here, like any other body that is not JSON.
    raise ValueError(f"{constant} is not a JSON value")


def route_headers(route: str, waited: float) -> list[tuple[bytes, bytes]]:
    """Where a request went and how long it waited for a swap or the queue, in ms
    (docs/compatibility.md, "Engine → client"): on an answer, an error, and keep-alives'
    early headers (``pending``, while no route is final)."""
    return [
        (b"x-swapgate-route", route.encode()),
        (b"x-swapgate-wait-ms", str(round(waited * 1000)).encode()),
    ]


def with_model(payload: dict[str, Any], model: str) -> bytes:
    return json.dumps({**payload, "model": model}, separators=(",", ":")).encode()


def with_fields(body: bytes, **fields: Any) -> bytes:
    """A JSON body with ``fields`` set (an engine's slot: ``id_slot``)."""
    return json.dumps({**json.loads(body), **fields}, separators=(",", ":")).encode()


JSON_BODY = (("content-type", "application/json"),)


def upstream_headers(
    scope_headers: list[tuple[bytes, bytes]],
    request_id: str,
    api_key: str | None,
    body: Sequence[tuple[str, str]] = JSON_BODY,
    *,
    anthropic: bool = False,
) -> list[tuple[str, str]]:
    """What goes upstream: the client's headers less ``DROP_REQUEST``, and swapgate's own.

    A body parsed as a JSON object goes as ``application/json`` whatever the client said:
    without it aiohttp would send ``application/octet-stream``, which vLLM and SGLang answer
    with 400, llama-swap with 404 and llama-cpp-python with 422. An upload says its own
    (``body``: its boundary and length). A Messages request to an upstream that speaks them
    (``anthropic``) carries the key as ``x-api-key`` too: Anthropic's API reads only that.
    """
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope_headers
        if name not in DROP_REQUEST
    ]
    headers.extend(body)
    headers.append(("x-request-id", request_id))
    if api_key:
        headers.append(("authorization", f"Bearer {api_key}"))
        if anthropic:
            headers.append(("x-api-key", api_key))
    return headers


# What the body sent so far is, which decides how a failure can still be told (``fail``):
# keep-alives alone ("pings": SSE comments or reasoning chunks; "whitespace"), or the
# upstream's own body under way ("events": a stream; "body": anything else).
BodyMode = Literal["pings", "whitespace", "events", "body"]


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

    @property
    def started(self) -> bool:
        return self.status != 0

    @property
    def whole(self) -> bool:
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

    async def write(self, chunk: bytes) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        last = self.dialect.last_event
        if self.mode == "events" and chunk.endswith(b"\n\n") and last.search(chunk):
            self._last_event_out = True

    async def end(self, chunk: bytes = b"") -> None:
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
        if self.mode == "body":
            return
        with contextlib.suppress(Exception):  # the client may be gone too
            if self.mode == "whitespace":
                await self.write(self.dialect.error_body(exc))
            else:
                await self.end(self.dialect.error_event(exc))


async def until_disconnect(receive: Receive, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` in this task; a client that disconnects first cancels it.

    One watcher task per request, not two: the watcher cancels the request's own task.
    """
    current = asyncio.current_task()
    assert current is not None
    state = {"done": False, "gone": False}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not state["done"]:
            state["gone"] = True
            current.cancel()

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
        watcher.cancel()
