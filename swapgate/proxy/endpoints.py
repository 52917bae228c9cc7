"""The proxied endpoints (docs/architecture.md, docs/compatibility.md) and the dialect each one
speaks to its clients.

Every endpoint is placed by its body's ``model`` and goes through the same request path; what
differs is how an error or a keep-alive looks to the client (its ``Dialect``), whether leading
whitespace is safe before its answer, how its body is read, and which protocol an upstream
must speak to take the request as it is (else it is translated:
swapgate/proxy/translate/translated.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from swapgate.errors import SwapgateError
from swapgate.proxy.translate import anthropic, ollama

Api = Literal["openai", "anthropic", "responses", "ollama"]  # the APIs a client may speak
PingKind = Literal["comment", "ping", "ndjson"]


class Dialect:
    """OpenAI's: errors are ``{"error": {...}}``, in-band one ``data:`` event
    (docs/operations.md)."""

    ping_kind: ClassVar[PingKind] = "comment"
    # What only a stream's last event holds: a client may hang up once it has it (Codex does)
    last_event: ClassVar[re.Pattern[bytes]] = re.compile(rb"data: \[DONE\]")
    event_end: ClassVar[bytes] = b"\n\n"  # how each of its stream's events ends
    sse: ClassVar[bool] = True  # its streams are Server-Sent Events (comments are safe)

    def error_body(self, exc: SwapgateError) -> bytes:
        return exc.body()

    def error_event(self, exc: SwapgateError) -> bytes:
        return b"data: " + exc.body() + b"\n\n"

    def ping(self, status: str) -> bytes:
        return f": swapgate {status}\n\n".encode()


class ResponsesDialect(Dialect):
    """The Responses API streams typed events: an error after the 200 is an ``error`` event.

    Its data carries the event's own fields (``type``, ``code``, ``message``) for clients that
    read the event, and the OpenAI error object, on which the openai SDK's stream raises
    ``APIError`` (it raises on any event whose data has an ``error``)."""

    last_event: ClassVar[re.Pattern[bytes]] = re.compile(
        rb"response\.(completed|incomplete|failed)"
    )

    def error_event(self, exc: SwapgateError) -> bytes:
        error = json.loads(exc.body())["error"]
        event = {
            "type": "error",
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
            "sequence_number": 0,
            "error": error,
        }
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"


class AnthropicDialect(Dialect):
    """Anthropic's: ``{"type": "error", "error": {"type", "message"}}``; its own keep-alive
    event, ``ping``, which its SDK skips (the comment before it says what swapgate waits for)."""

    ping_kind: ClassVar[PingKind] = "ping"
    last_event: ClassVar[re.Pattern[bytes]] = re.compile(rb"message_stop")

    def error_body(self, exc: SwapgateError) -> bytes:
        return anthropic.error_body(exc.status, exc.message)

    def error_event(self, exc: SwapgateError) -> bytes:
        return b"event: error\ndata: " + self.error_body(exc) + b"\n\n"

    def ping(self, status: str) -> bytes:
        return f': swapgate {status}\nevent: ping\ndata: {{"type": "ping"}}\n\n'.encode()


class OllamaDialect(Dialect):
    """Ollama's: errors are ``{"error": "..."}``; a stream is NDJSON, which has no comments, so
    its keep-alive is a line with nothing in it (an empty ``content``, or ``response`` for
    generate, ``done: false``), which the ollama libraries hand on as an empty piece of the
    answer; an error after the 200 is one ``{"error": ...}`` line, which the Python library
    raises as ``ResponseError`` and the JavaScript one as an ``Error``."""

    ping_kind: ClassVar[PingKind] = "ndjson"
    last_event: ClassVar[re.Pattern[bytes]] = re.compile(rb'"done":true')
    event_end: ClassVar[bytes] = b"\n"
    sse: ClassVar[bool] = False

    def __init__(self, field: Literal["message", "response"] = "message") -> None:
        self._field = field

    def error_body(self, exc: SwapgateError) -> bytes:
        return ollama.error_body(exc.message)

    def error_event(self, exc: SwapgateError) -> bytes:
        return ollama.error_body(exc.message) + b"\n"

    def ping(self, status: str) -> bytes:
        empty: object = {"role": "assistant", "content": ""} if self._field == "message" else ""
        line = {"created_at": ollama.now_text(), self._field: empty, "done": False}
        return json.dumps(line, separators=(",", ":")).encode() + b"\n"


OPENAI, RESPONSES, ANTHROPIC = Dialect(), ResponsesDialect(), AnthropicDialect()
OLLAMA_CHAT, OLLAMA_GENERATE = OllamaDialect("message"), OllamaDialect("response")


@dataclass(frozen=True, slots=True)
class Endpoint:
    path: str
    label: str  # in metrics and the access log: bounded, one per endpoint
    dialect: Dialect = OPENAI
    protocol: Api = "openai"  # what an upstream must speak to take the request unchanged
    chat: bool = False  # keep-alives may be reasoning chunks
    json_answer: bool = True  # a non-streaming answer is JSON: leading whitespace is safe
    multipart: bool = False  # an upload: streamed through, ``model`` read from its form
    streams_unless_told: bool = False  # streamed unless ``"stream": false`` (Ollama's)


ENDPOINTS = {
    e.path: e
    for e in (
        Endpoint("/v1/chat/completions", "chat", chat=True),
        Endpoint("/v1/completions", "completions"),
        Endpoint("/v1/embeddings", "embeddings"),
        Endpoint("/v1/responses", "responses", RESPONSES, "responses"),
        Endpoint("/v1/messages", "messages", ANTHROPIC, "anthropic"),
        Endpoint("/v1/messages/count_tokens", "count_tokens", ANTHROPIC, "anthropic"),
        Endpoint("/v1/rerank", "rerank"),
        Endpoint("/v1/images/generations", "images"),
        Endpoint("/v1/audio/speech", "speech", json_answer=False),  # audio bytes
        Endpoint("/v1/audio/transcriptions", "transcriptions", multipart=True),
        # Ollama's API (swapgate/proxy/translate/ollama.py), translated to OpenAI's upstream
        Endpoint("/api/chat", "ollama_chat", OLLAMA_CHAT, "ollama", streams_unless_told=True),
        Endpoint(
            "/api/generate", "ollama_generate", OLLAMA_GENERATE, "ollama", streams_unless_told=True
        ),
        Endpoint("/api/embed", "ollama_embed", OLLAMA_CHAT, "ollama"),
        Endpoint("/api/embeddings", "ollama_embeddings", OLLAMA_CHAT, "ollama"),
    )
}
