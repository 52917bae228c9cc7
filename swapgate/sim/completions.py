"""What the simulated model says (a `Reply`), and its OpenAI shapes, streamed at a `Pace`.

A reply is always a whole turn of the length asked for: it never says it was cut short
(``finish_reason`` "stop", Anthropic's ``stop_reason`` "end_turn"), a tool call aside.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

WORDS = (" Tokens", " flow", " at", " the", " configured", " rate", ".")
TOOL_ARGUMENTS = ('{"query": ', '"sim"}')  # {"query": "sim"} in two fragments, like an engine


@dataclass(frozen=True)
class Reply:
    """The pieces a model streams: words, or the JSON arguments of a call of ``tool``."""

    pieces: tuple[str, ...]
    tool: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class Pace:
    """Tokens per second, and the piece before which a stream crashes, if it does."""

    rate: float
    crash_at: int | None = None

    async def over(self, pieces: Sequence[str]) -> AsyncIterator[str]:
        for index, piece in enumerate(pieces):
            if index == self.crash_at:
                raise ConnectionResetError("simulated crash mid-stream")
            yield piece
            await asyncio.sleep(1 / self.rate)


def tokens(model: str, count: int) -> list[str]:
    head = ["Hello", " from", f" {model}", "."]
    body = [WORDS[i % len(WORDS)] for i in range(max(0, count - len(head)))]
    return (head + body)[:count]


def max_tokens(body: dict[str, Any], default: int) -> int:
    value = (
        body.get("max_tokens")
        or body.get("max_completion_tokens")
        or body.get("max_output_tokens")
        or default
    )
    return max(1, int(value))


def reply(model: str, count: int, *, tool: str | None = None, quoting: str | None = None) -> Reply:
    """A call of ``tool`` if one is named, else ``count`` words after ``quoting`` a tool, if any."""
    if tool is not None:
        return Reply(TOOL_ARGUMENTS, tool)
    lead = () if quoting is None else (f"The tool said: {quoting} ",)
    return Reply((*lead, *tokens(model, count)))


def plain_reply(model: str, _: dict[str, Any], count: int) -> Reply:
    return reply(model, count)


def chat_reply(model: str, body: dict[str, Any], count: int) -> Reply:
    """After a tool's answer, words that quote it; with tools on offer, a call of the first."""
    last = last_message(body)
    if last.get("role") == "tool":
        return reply(model, count, quoting=" ".join(texts(last.get("content"))))
    return reply(model, count, tool=first_tool_name(body, "function", "name"))


def last_message(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return last if isinstance(last, dict) else {}


def first_tool_name(body: dict[str, Any], *path: str) -> str | None:
    tools = body.get("tools")
    node = tools[0] if isinstance(tools, list) and tools else None
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, str) else None


def texts(value: object) -> Iterator[str]:
    """The text in a message or its content however nested: strings, text blocks, lists of them."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from texts(item)
    elif isinstance(value, dict):
        if isinstance(value.get("text"), str):
            yield value["text"]
        yield from texts(value.get("content"))


def count_words(value: object) -> int:
    return max(1, sum(len(text.split()) for text in texts(value)))


def chat_completion(model: str, _: dict[str, Any], said: Reply) -> dict[str, Any]:
    choice = {"index": 0, "message": _message(said), "finish_reason": _finish(said)}
    return {**_base(model), "object": "chat.completion", "choices": [choice], "usage": _usage(said)}


def text_completion(model: str, _: dict[str, Any], said: Reply) -> dict[str, Any]:
    choice = {"index": 0, "text": said.text, "finish_reason": "stop"}
    return {**_base(model), "object": "text_completion", "choices": [choice], "usage": _usage(said)}


def embeddings(model: str, body: dict[str, Any]) -> dict[str, Any]:
    inputs = body.get("input", "")
    items = inputs if isinstance(inputs, list) else [inputs]
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": [round(0.1 * (i + k), 3) for k in range(8)],
        }
        for i in range(len(items))
    ]
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": len(items)}}


async def sse_chunks(
    kind: str, model: str, body: dict[str, Any], said: Reply, pace: Pace
) -> AsyncIterator[bytes]:
    """Chat (``kind`` "chat") or text completion chunks, then usage if asked, then [DONE]."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    ident = f"sim-{uuid.uuid4().hex[:12]}"
    head = {"id": ident, "object": obj, "created": int(time.time()), "model": model}
    if said.tool is not None:
        call = {"index": 0, **_tool_call(said.tool, "")}
        yield _event({**head, "choices": [_delta({"role": "assistant", "tool_calls": [call]})]})
    first = True
    async for piece in pace.over(said.pieces):
        yield _event({**head, "choices": [_piece(kind, said, piece, first)]})
        first = False
    last = {"index": 0, "text": ""} if kind == "text" else {"index": 0, "delta": {}}
    yield _event({**head, "choices": [{**last, "finish_reason": _finish(said)}]})
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        yield _event({**head, "choices": [], "usage": _usage(said)})
    yield b"data: [DONE]\n\n"


def _piece(kind: str, said: Reply, piece: str, first: bool) -> dict[str, Any]:
    if kind == "text":
        return {"index": 0, "text": piece, "finish_reason": None}
    if said.tool is not None:
        return _delta({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    return _delta({"role": "assistant", "content": piece} if first else {"content": piece})


def _delta(delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "finish_reason": None}


def _message(said: Reply) -> dict[str, Any]:
    if said.tool is None:
        return {"role": "assistant", "content": said.text}
    call = _tool_call(said.tool, said.text)
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}


def _finish(said: Reply) -> str:
    return "stop" if said.tool is None else "tool_calls"


def _usage(said: Reply) -> dict[str, int]:
    count = len(said.pieces)
    return {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1}


def _base(model: str) -> dict[str, Any]:
    return {"id": f"sim-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": model}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
