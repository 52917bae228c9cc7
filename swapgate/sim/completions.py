"""OpenAI-shaped answers, streamed at the configured token rate."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

WORDS = (" Tokens", " flow", " at", " the", " configured", " rate", ".")


def tokens(model: str, count: int) -> list[str]:
    head = ["Hello", " from", f" {model}", "."]
    body = [WORDS[i % len(WORDS)] for i in range(max(0, count - len(head)))]
    return (head + body)[:count]


def max_tokens(body: dict[str, Any], default: int) -> int:
    value = body.get("max_tokens") or body.get("max_completion_tokens") or default
    return max(1, int(value))


def completion(kind: str, model: str, text: str, count: int) -> dict[str, Any]:
    base = {"id": f"sim-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": model}
    usage = {"prompt_tokens": 1, "completion_tokens": count, "total_tokens": count + 1}
    if kind == "chat":
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "stop"}
    return {**base, "object": "text_completion", "choices": [choice], "usage": usage}


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
    kind: str, model: str, words: list[str], rate: float, crash_at: int | None
) -> AsyncIterator[bytes]:
    ident, created = f"sim-{uuid.uuid4().hex[:12]}", int(time.time())
    for index, word in enumerate(words):
        if crash_at is not None and index == crash_at:
            raise ConnectionResetError("simulated crash mid-stream")
        yield _event(_chunk(kind, ident, created, model, word, index == 0, None))
        await asyncio.sleep(1 / rate)
    yield _event(_chunk(kind, ident, created, model, "", False, "stop"))
    yield b"data: [DONE]\n\n"


def _chunk(
    kind: str, ident: str, created: int, model: str, word: str, first: bool, finish: str | None
) -> dict[str, Any]:
    if kind == "chat":
        delta = {"role": "assistant", "content": word} if first else {"content": word}
        choice: dict[str, Any] = {"index": 0, "delta": delta if word or first else {}}
        obj = "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": word}, "text_completion"
    choice["finish_reason"] = finish
    return {"id": ident, "object": obj, "created": created, "model": model, "choices": [choice]}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"
