"""Chat completion chunks, streamed, as Anthropic Messages events
(swapgate/proxy/translate/anthropic.py translates the rest of a Messages request and its
answer)."""

from __future__ import annotations

import uuid
from typing import Any

from swapgate.proxy.translate.anthropic import (
    anthropic_message,
    anthropic_usage,
    compact_json,
    error_body,
    stop_reason_of,
)
from swapgate.proxy.translate.chat_stream import ChatStreamReader
from swapgate.proxy.translate.fields import as_dict, as_list, as_str


class StreamTranslator(ChatStreamReader):
    """Chat completion SSE bytes -> Anthropic Messages SSE bytes.

    Blocks are numbered in the order they open; at most one is open. A finish_reason closes
    it; ``[DONE]`` (or the end of the body) sends message_delta and message_stop, once. An
    upstream error, or data that is not JSON, becomes one ``error`` event that ends the stream.
    ``input_tokens`` is the engine's count where it sends one, else ``prompt_estimate``: never
    0 for a prompt (an engine that ignores ``stream_options`` sends no usage).
    """

    def __init__(self, model: str, prompt_estimate: int = 0) -> None:
        super().__init__()
        self._model = model
        self._started = False
        self._blocks = 0
        self._open: str | None = None  # "text" or "tool_use"
        self._tool: tuple[Any, str] = (None, "")  # the open call's index and id
        self._called_tools = False
        self._finish_reason: Any = None
        self._usage = {"input_tokens": prompt_estimate, "output_tokens": 0}
        self._deltas = 0  # the output's chunks: its token count where the engine gives none

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        out = self._start(chunk.get("id"))
        if isinstance(chunk.get("usage"), dict):  # the last chunk's, often with no choices
            counted = anthropic_usage(chunk["usage"])
            self._usage = {k: v or self._usage[k] for k, v in counted.items()}
        choices = as_list(chunk.get("choices"))  # one choice: a request from /v1/messages has no n
        return out + (self._choice(as_dict(choices[0])) if choices else b"")

    def _choice(self, choice: dict[str, Any]) -> bytes:
        delta = as_dict(choice.get("delta"))
        out = b""
        if isinstance(delta.get("content"), str) and delta["content"]:
            if self._open != "text":
                out += self._open_block({"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": delta["content"]})
        for call in map(as_dict, as_list(delta.get("tool_calls"))):
            out += self._tool_call(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
            out += self._close_block()
        return out

    def _tool_call(self, call: dict[str, Any]) -> bytes:
        index, call_id = call.get("index"), as_str(call.get("id"))
        function = as_dict(call.get("function"))
        out = b""
        new_id = call_id and call_id != self._tool[1]  # engines repeat the id, or send it once
        if self._open != "tool_use" or index != self._tool[0] or new_id:
            self._tool = (index, call_id or "toolu_" + uuid.uuid4().hex)
            self._called_tools = True
            name = as_str(function.get("name"))
            out += self._open_block(
                {"type": "tool_use", "id": self._tool[1], "name": name, "input": {}}
            )
        if isinstance(function.get("arguments"), str) and function["arguments"]:
            out += self._delta({"type": "input_json_delta", "partial_json": function["arguments"]})
        return out

    def _start(self, chunk_id: Any) -> bytes:
        if self._started:
            return b""
        self._started = True
        message = anthropic_message(chunk_id, self._model, [], None, {})
        message["usage"] = dict(self._usage)  # the prompt's size, estimated until counted
        return _sse({"type": "message_start", "message": message})

    def _open_block(self, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._open = block["type"]
        self._blocks += 1
        return out + _sse(
            {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        self._deltas += 1
        return _sse({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _sse({"type": "content_block_stop", "index": self._blocks - 1})

    def _end(self) -> bytes:
        out = self._start(None) + self._close_block()
        delta = {
            "stop_reason": stop_reason_of(self._finish_reason, self._called_tools),
            "stop_sequence": None,
        }
        usage = dict(self._usage)
        if not usage["output_tokens"]:  # no usage chunk (llama-cpp-python ignores stream_options)
            usage["output_tokens"] = self._deltas
        out += _sse({"type": "message_delta", "delta": delta, "usage": usage})
        return out + _sse({"type": "message_stop"})

    def _fail(self, message: str) -> bytes:
        return b"event: error\ndata: " + error_body(500, message) + b"\n\n"


def _sse(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + compact_json(event) + b"\n\n"
