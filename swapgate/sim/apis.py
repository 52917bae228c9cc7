"""The answer shapes of every API the simulator speaks, and which path speaks which.

Two families: *token* APIs (chat and text completions, OpenAI Responses, Anthropic Messages)
answer with a `Reply` that takes ``token_rate`` to say, whole or streamed; *instant* APIs
(embeddings, count_tokens, rerank, images, speech, transcriptions) answer at once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import struct
import time
import uuid
import wave
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from starlette.datastructures import UploadFile

import swapgate.sim.completions as completions
from swapgate.sim.completions import Pace, Reply, count_words, reply

Body = dict[str, Any]

PATHS = {
    "openai": {
        "/v1/chat/completions": "chat",
        "/v1/completions": "text",
        "/v1/embeddings": "embedding",
        "/v1/responses": "responses",
        "/v1/rerank": "rerank",
        "/v1/images/generations": "image",
        "/v1/audio/speech": "speech",
        "/v1/audio/transcriptions": "transcription",
    },
    "anthropic": {"/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens"},
}
ANTHROPIC = frozenset(PATHS["anthropic"].values())  # kinds with Anthropic's key and errors
HASH_CHUNK = 1 << 20


class Whole(NamedTuple):
    """An answer sent in one piece."""

    content: bytes
    media_type: str = "application/json"


def as_json(answer: Body) -> Whole:
    return Whole(json.dumps(answer).encode())


@dataclass(frozen=True)
class TokenApi:
    """What the model says to a request, and that reply's shape whole and streamed."""

    reply: Callable[[str, Body, int], Reply]
    whole: Callable[[str, Body, Reply], Body]
    stream: Callable[[str, Body, Reply, Pace], AsyncIterator[bytes]]


# -- OpenAI Responses ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Response:
    """One Responses answer's identity, shared by its whole form and each event of its stream."""

    model: str
    input_tokens: int
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, said: Reply | None) -> Body:
        """The response object: in progress until ``said`` is known."""
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "in_progress" if said is None else "completed",
            "model": self.model,
            "output": [] if said is None else [self.item(said.text)],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "usage": None if said is None else self.usage(len(said.pieces)),
        }

    def item(self, text: str | None) -> Body:
        return {
            "type": "message",
            "id": self.item_id,
            "status": "in_progress" if text is None else "completed",
            "role": "assistant",
            "content": [] if text is None else [_output_text(text)],
        }

    def usage(self, output_tokens: int) -> Body:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + output_tokens,
        }


def response(model: str, body: Body, said: Reply) -> Body:
    return _Response(model, count_words(body.get("input"))).body(said)


async def response_events(model: str, body: Body, said: Reply, pace: Pace) -> AsyncIterator[bytes]:
    answer = _Response(model, count_words(body.get("input")))
    numbers = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return _typed_event({"type": kind, "sequence_number": next(numbers), **fields})

    at = {"item_id": answer.item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=answer.body(None))
    yield event("response.in_progress", response=answer.body(None))
    yield event("response.output_item.added", output_index=0, item=answer.item(None))
    yield event("response.content_part.added", **at, part=_output_text(""))
    async for piece in pace.over(said.pieces):
        yield event("response.output_text.delta", **at, delta=piece, logprobs=[])
    yield event("response.output_text.done", **at, text=said.text, logprobs=[])
    yield event("response.content_part.done", **at, part=_output_text(said.text))
    yield event("response.output_item.done", output_index=0, item=answer.item(said.text))
    yield event("response.completed", response=answer.body(said))


def _output_text(text: str) -> Body:
    return {"type": "output_text", "text": text, "annotations": []}


# -- Anthropic Messages ----------------------------------------------------------------------


def message_reply(model: str, body: Body, count: int) -> Reply:
    """After a user turn with tool results, words quoting them; with tools, a call of the first."""
    last = completions.last_message(body)
    if last.get("role") != "user":
        return reply(model, count)
    content = last.get("content")
    blocks = content if isinstance(content, list) else []
    results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results:
        return reply(model, count, quoting=" ".join(completions.texts(results)))
    return reply(model, count, tool=completions.first_tool_name(body, "name"))


@dataclass(frozen=True)
class _Message:
    model: str
    input_tokens: int
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:24]}")
    tool_use_id: str = field(default_factory=lambda: f"toolu_{uuid.uuid4().hex[:24]}")

    def body(self, said: Reply | None) -> Body:
        """The message: empty, as a stream starts, until ``said`` is known."""
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if said is None else [self.block(said, said.text)],
            "stop_reason": None if said is None else _stop_reason(said),
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": 0 if said is None else len(said.pieces),
            },
        }

    def block(self, said: Reply, text: str) -> Body:
        """The content block, with ``text`` so far (the tool's JSON input, for a tool call)."""
        if said.tool is None:
            return {"type": "text", "text": text}
        tool_input = json.loads(text) if text else {}
        return {"type": "tool_use", "id": self.tool_use_id, "name": said.tool, "input": tool_input}


def message(model: str, body: Body, said: Reply) -> Body:
    return _Message(model, _prompt_words(body)).body(said)


async def message_events(model: str, body: Body, said: Reply, pace: Pace) -> AsyncIterator[bytes]:
    answer = _Message(model, _prompt_words(body))
    yield _typed_event({"type": "message_start", "message": answer.body(None)})
    start = {"index": 0, "content_block": answer.block(said, "")}
    yield _typed_event({"type": "content_block_start", **start})
    yield _typed_event({"type": "ping"})
    async for piece in pace.over(said.pieces):
        delta = (
            {"type": "text_delta", "text": piece}
            if said.tool is None
            else {"type": "input_json_delta", "partial_json": piece}
        )
        yield _typed_event({"type": "content_block_delta", "index": 0, "delta": delta})
    yield _typed_event({"type": "content_block_stop", "index": 0})
    stop: Body = {"stop_reason": _stop_reason(said), "stop_sequence": None}
    usage = {"output_tokens": len(said.pieces)}
    yield _typed_event({"type": "message_delta", "delta": stop, "usage": usage})
    yield _typed_event({"type": "message_stop"})


def count_tokens(_: str, body: Body) -> Body:
    return {"input_tokens": _prompt_words(body)}


def anthropic_error(status: int, message: str) -> Body:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    return {"type": "error", "error": {"type": kind.get(status, "api_error"), "message": message}}


def _prompt_words(body: Body) -> int:
    return count_words([body.get("system"), body.get("messages")])


def _stop_reason(said: Reply) -> str:
    return "end_turn" if said.tool is None else "tool_use"


# -- rerank, images, audio -------------------------------------------------------------------


def rerank(model: str, body: Body) -> Body:
    """Documents by the share of the query's words they hold; ties keep their order."""
    query = _word_set(body.get("query"))
    documents = body.get("documents")
    docs = [_document_text(d) for d in documents] if isinstance(documents, list) else []
    scores = [_overlap(query, doc) for doc in docs]
    ranked = sorted(range(len(docs)), key=lambda i: -scores[i])
    results = [
        {"index": i, "relevance_score": scores[i], "document": {"text": docs[i]}} for i in ranked
    ]
    top_n = body.get("top_n")
    if isinstance(top_n, int) and top_n >= 0:
        results = results[:top_n]
    total = count_words([body.get("query"), docs])
    ident = f"rerank-{uuid.uuid4().hex[:12]}"
    return {"id": ident, "model": model, "results": results, "usage": {"total_tokens": total}}


def _document_text(document: object) -> str:
    text = document.get("text") if isinstance(document, dict) else document
    return text if isinstance(text, str) else ""


def _word_set(text: object) -> set[str]:
    return set(str(text or "").lower().split())


def _overlap(query: set[str], document: str) -> float:
    return round(len(query & _word_set(document)) / len(query), 4) if query else 0.0


def images(_: str, body: Body) -> Body:
    n = body.get("n")
    count = min(max(n, 1), 10) if isinstance(n, int) else 1
    picture = base64.b64encode(tiny_png()).decode()
    return {"created": int(time.time()), "data": [{"b64_json": picture} for _ in range(count)]}


def tiny_png(side: int = 8) -> bytes:
    """A grey ``side``×``side`` RGB PNG."""
    rows = (b"\x00" + b"\x80\x80\x80" * side) * side  # each row: filter type 0, then pixels
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    chunks = (_png_chunk(b"IHDR", header), _png_chunk(b"IDAT", zlib.compress(rows)))
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks) + _png_chunk(b"IEND", b"")


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data)
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


async def speech(_: str, body: Body) -> Whole:
    """Silence, 16-bit mono at 16 kHz, 50 ms per character of the input (100 ms at least)."""
    text = body.get("input")
    frames = 800 * max(2, len(text) if isinstance(text, str) else 0)
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(b"\x00\x00" * frames)
    return Whole(out.getvalue(), "audio/wav")


async def transcription(_: str, body: Body) -> Whole:
    """The upload's size and SHA-256, read in chunks from its spooled file."""
    upload: UploadFile = body["file"]
    digest, size = hashlib.sha256(), 0
    while chunk := await upload.read(HASH_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    text = f"sim transcript of {size} bytes"
    if body.get("stream") == "true":
        events = [{"type": "transcript.text.delta", "delta": text}]
        events.append({"type": "transcript.text.done", "text": text})
        return Whole(b"".join(_data_event(e) for e in events), "text/event-stream")
    if body.get("response_format") == "text":
        return Whole(text.encode(), "text/plain")
    return as_json({"text": text, "bytes": size, "sha256": digest.hexdigest()})


def _instant(build: Callable[[str, Body], Body]) -> Callable[[str, Body], Awaitable[Whole]]:
    async def answer(model: str, body: Body) -> Whole:
        return as_json(build(model, body))

    return answer


def _typed_event(payload: Body) -> bytes:
    return f"event: {payload['type']}\n".encode() + _data_event(payload)


def _data_event(payload: Body) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


TOKEN_APIS = {
    "chat": TokenApi(
        completions.chat_reply, completions.chat_completion, partial(completions.sse_chunks, "chat")
    ),
    "text": TokenApi(
        completions.plain_reply,
        completions.text_completion,
        partial(completions.sse_chunks, "text"),
    ),
    "responses": TokenApi(completions.plain_reply, response, response_events),
    "messages": TokenApi(message_reply, message, message_events),
}
INSTANT = {
    "embedding": _instant(completions.embeddings),
    "count_tokens": _instant(count_tokens),
    "rerank": _instant(rerank),
    "image": _instant(images),
    "speech": speech,
    "transcription": transcription,
}
