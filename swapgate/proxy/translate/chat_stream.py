"""Reading a chat completions stream, chunk by chunk, for a translation to another API's events
(Anthropic Messages: anthropic_stream.py; OpenAI Responses: responses_stream.py)."""

from __future__ import annotations

import json
from typing import Any

from swapgate.proxy.translate.anthropic import error_message


class ChatStreamReader:
    """Chat completion SSE bytes (arbitrary chunk boundaries) -> the events a subclass makes.

    A subclass gets each JSON chunk (``_chunk``), the end (``_end``: ``[DONE]`` or the end of
    the body, once) and a failure (``_fail``: an upstream error, or data that is not a JSON
    object), after which nothing more is read.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []  # the data lines of the event being read
        self._done = False

    @property
    def done(self) -> bool:
        """Whether the translated stream's last event was made (nothing more will be)."""
        return self._done

    def feed(self, chunk: bytes) -> bytes:
        """The events ``chunk`` completes (b"" if none yet)."""
        if self._done:
            return b""
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return b"".join(self._line(line) for line in lines)

    def close(self) -> bytes:
        """The upstream's body ended: its last unterminated event, then what is still owed."""
        out = self._line(self._buffer) + self._line(b"")
        self._buffer = b""
        return out + (b"" if self._done else self._finish())

    def _line(self, raw: bytes) -> bytes:
        if self._done:
            return b""
        line = raw.removesuffix(b"\r").decode("utf-8", errors="replace")
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        elif not line and self._data:
            data, self._data = "\n".join(self._data), []
            return self._event(data)
        return b""  # comments, other fields, blank lines between events

    def _event(self, data: str) -> bytes:
        if data.strip() == "[DONE]":
            return self._finish()
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            return self._failed("the backend's stream sent data that is not JSON")
        if not isinstance(chunk, dict):
            return self._failed("the backend's stream sent data that is not a JSON object")
        if chunk.get("error") is not None:
            return self._failed(error_message(chunk) or "the backend's stream failed")
        return self._chunk(chunk)

    def _finish(self) -> bytes:
        out = self._end()
        self._done = True
        return out

    def _failed(self, message: str) -> bytes:
        self._done = True
        return self._fail(message)

    def _chunk(self, chunk: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError

    def _fail(self, message: str) -> bytes:
        raise NotImplementedError
