"""Chat completion chunks, streamed, as the OpenAI Responses event sequence
(swapgate/proxy/translate/responses.py translates the rest of a Responses request and its answer).

The sequence is the one OpenAI's own server sends and its SDK and Codex read:
``response.created``, ``response.in_progress``; per output item ``response.output_item.added``,
its deltas (``response.content_part.added`` + ``response.output_text.delta``…, or
``response.function_call_arguments.delta``…), their ``….done`` events and
``response.output_item.done``; then ``response.completed`` (``response.incomplete`` when the
engine stopped at ``max_output_tokens``) with the whole Response and its usage. Every event has
a ``sequence_number``; an upstream failure is one ``response.failed`` and the stream ends.
"""

from __future__ import annotations

import json
from typing import Any

from swapgate.proxy.translate.chat_stream import ChatStreamReader
from swapgate.proxy.translate.fields import as_dict, as_list, as_str
from swapgate.proxy.translate.responses import (
    call_item,
    new_id,
    response,
    text_item,
    usage_from_chat,
)


class ResponsesStream(ChatStreamReader):
    """Chat completion SSE bytes -> Responses SSE bytes. At most one output item is open: a
    text message, or one tool call (whose arguments arrive in pieces)."""

    def __init__(self, model: str, custom: frozenset[str], prompt_estimate: int) -> None:
        super().__init__()
        self._model = model
        self._custom = custom  # free-form tools: their calls go out as custom_tool_call
        self._estimate = prompt_estimate
        self._id: Any = None
        self._sequence = 0
        self._started = False
        self._items: list[dict[str, Any]] = []  # every finished item, for response.completed
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""
        self._call_index: Any = None
        self._finish_reason: Any = None
        self._usage: Any = None
        self._deltas = 0

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        out = self._start(chunk.get("id"))
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = as_list(chunk.get("choices"))
        if not choices:
            return out
        choice = as_dict(choices[0])
        delta = as_dict(choice.get("delta"))
        if isinstance(delta.get("content"), str) and delta["content"]:
            out += self._text_delta(delta["content"])
        for call in map(as_dict, as_list(delta.get("tool_calls"))):
            out += self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
        return out

    def _start(self, chat_id: Any) -> bytes:
        if self._started:
            return b""
        self._started, self._id = True, chat_id
        begun = self._response("in_progress")
        return self._emit("response.created", response=begun) + self._emit(
            "response.in_progress", response=begun
        )

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "message":
            out += self._close_item()
            out += self._open_item(text_item(new_id("msg_"), "", "in_progress"))
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._emit("response.content_part.added", **self._at(), part=part)
        self._text += text
        self._deltas += 1
        return out + self._emit("response.output_text.delta", **self._at(), delta=text, logprobs=[])

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        function = as_dict(call.get("function"))
        call_id, index = as_str(call.get("id")), call.get("index")
        out = b""
        opened = self._open is not None and self._open["type"] == "function_call"
        new_id_given = bool(call_id) and opened and call_id != self._open_call_id()
        if not opened or index != self._call_index or new_id_given:
            out += self._close_item()
            self._call_index = index
            name = as_str(function.get("name"))
            item = {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": call_id or new_id("call_"),
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
            out += self._open_item(item)
        arguments = as_str(function.get("arguments"))
        if arguments:
            assert self._open is not None
            self._open["arguments"] += arguments
            self._deltas += 1
            out += self._emit(
                "response.function_call_arguments.delta",
                item_id=self._open["id"],
                output_index=len(self._items),
                delta=arguments,
            )
        return out

    def _open_call_id(self) -> str:
        return as_str(self._open.get("call_id")) if self._open else ""

    def _open_item(self, item: dict[str, Any]) -> bytes:
        self._open = item
        return self._emit("response.output_item.added", output_index=len(self._items), item=item)

    def _close_item(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        index = len(self._items)
        if item["type"] == "message":
            done = text_item(item["id"], self._text, "completed")
            part = done["content"][0]
            out = self._emit(
                "response.output_text.done", **self._at(item), text=self._text, logprobs=[]
            )
            out += self._emit("response.content_part.done", **self._at(item), part=part)
            self._text = ""
        else:
            done = call_item(
                item["id"], item["call_id"], item["name"], item["arguments"], self._custom
            )
            out = self._arguments_done(done, index)
        self._items.append(done)
        return out + self._emit("response.output_item.done", output_index=index, item=done)

    def _arguments_done(self, item: dict[str, Any], index: int) -> bytes:
        if item["type"] == "custom_tool_call":
            return self._emit(
                "response.custom_tool_call_input.done",
                item_id=item["id"],
                output_index=index,
                input=item["input"],
            )
        return self._emit(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=index,
            name=item["name"],
            arguments=item["arguments"],
        )

    def _at(self, item: dict[str, Any] | None = None) -> dict[str, Any]:
        """Where a text delta or part goes: its message item, the first part of it."""
        item = item or self._open or {}
        return {"item_id": item.get("id"), "output_index": len(self._items), "content_index": 0}

    def _end(self) -> bytes:
        out = self._start(None) + self._close_item()
        status = "incomplete" if self._finish_reason == "length" else "completed"
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._emit(kind, response=self._response(status))

    def _response(self, status: str) -> dict[str, Any]:
        usage = usage_from_chat(self._usage, self._estimate)
        if not usage["output_tokens"] and self._deltas:  # the engine sent no usage chunk
            usage["output_tokens"] = self._deltas
            usage["total_tokens"] = usage["input_tokens"] + self._deltas
        done = status != "in_progress"
        return response(
            self._id, self._model, self._items if done else [], status, usage if done else None
        )

    def _fail(self, message: str) -> bytes:
        failed = self._response("failed")
        failed["error"] = {"code": "server_error", "message": message}
        return self._start(None) + self._emit("response.failed", response=failed)

    def _emit(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        body = json.dumps(data, separators=(",", ":")).encode()
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"
