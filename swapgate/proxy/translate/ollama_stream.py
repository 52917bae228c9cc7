"""Chat (or completions) chunks, streamed, as Ollama's NDJSON lines
(swapgate/proxy/translate/ollama.py translates the request and a whole answer).

One line per chunk that says something: its text (``message.content``, or ``response`` for
generate) and its thinking (``reasoning_content``). Tool calls, which chat streams in pieces,
go out whole in one line once the engine finishes them, arguments as an object, as Ollama
sends them. The last line has ``done: true``, the counts and the durations; an upstream error
is one ``{"error": ...}`` line, which the ollama libraries raise (Python: ``ResponseError``).
"""

from __future__ import annotations

import json
from typing import Any

from swapgate.proxy.translate.chat_stream import ChatStreamReader
from swapgate.proxy.translate.fields import as_dict, as_list, as_str
from swapgate.proxy.translate.ollama import (
    Kind,
    Times,
    done_reason,
    error_body,
    final,
    now_text,
    tool_calls,
)


class OllamaStream(ChatStreamReader):
    def __init__(self, kind: Kind, model: str, times: Times) -> None:
        super().__init__()
        self._kind, self._model, self._times = kind, model, times
        self._calls: dict[Any, dict[str, Any]] = {}  # by index: id, name, arguments so far
        self._reason: Any = None
        self._usage: dict[str, Any] = {}
        self._chunks = 0  # the output's chunks: its token count where the engine gives none

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = as_list(chunk.get("choices"))
        if not choices:
            return b""
        choice = as_dict(choices[0])
        delta = as_dict(choice.get("delta"))
        text = as_str(delta.get("content")) or as_str(choice.get("text"))
        thinking = as_str(delta.get("reasoning_content"))
        for call in map(as_dict, as_list(delta.get("tool_calls"))):
            self._call_piece(call)
        out = b""
        if text or thinking:
            self._times.token()
            self._chunks += 1
            out = self._piece(text, thinking)
        if choice.get("finish_reason") is not None:
            self._reason = choice["finish_reason"]
            out += self._tool_line()
        return out

    def _call_piece(self, call: dict[str, Any]) -> None:
        self._times.token()
        index = call.get("index", len(self._calls))
        function = as_dict(call.get("function"))
        held = self._calls.setdefault(index, {"function": {"name": "", "arguments": ""}})
        held["function"]["name"] += as_str(function.get("name"))
        held["function"]["arguments"] += as_str(function.get("arguments"))

    def _tool_line(self) -> bytes:
        if not self._calls:
            return b""
        calls, self._calls = list(self._calls.values()), {}
        message = {"role": "assistant", "content": "", "tool_calls": tool_calls(calls)}
        return _ndjson(
            {"model": self._model, "created_at": now_text(), "message": message, "done": False}
        )

    def _piece(self, text: str, thinking: str) -> bytes:
        out: dict[str, Any] = {"model": self._model, "created_at": now_text()}
        if self._kind == "generate":
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        else:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            out["message"] = message
        out["done"] = False
        return _ndjson(out)

    def _end(self) -> bytes:
        out = self._tool_line()
        last: dict[str, Any] = {"model": self._model, "created_at": now_text()}
        if self._kind == "generate":
            last["response"] = ""
        else:
            last["message"] = {"role": "assistant", "content": ""}
        last |= final(done_reason(self._reason), self._usage, self._times, self._chunks)
        return out + _ndjson(last)

    def _fail(self, message: str) -> bytes:
        return error_body(message) + b"\n"


def _ndjson(line: dict[str, Any]) -> bytes:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
