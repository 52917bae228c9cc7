"""Request captures: the bodies and headers of chosen requests, kept for debugging.

Which requests are captured is ``CaptureConfig``'s choice, changed at runtime by
``set_config``. Captures live in the activity log's database and go through its thread:
``store`` only filters, cuts and buffers; the worker compresses (zstd) and writes, keeping the
newest ``keep``. Credentials never reach the buffer, let alone the disk: the headers in
``SECRET_HEADERS`` are left out entirely, not masked or hashed.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zstandard

from swapgate.activity.database import WriteBuffer
from swapgate.activity.log import ActivityLog
from swapgate.config.settings import CaptureConfig

# Credentials in any dialect a client or an upstream may send them: OpenAI's and Anthropic's,
# Azure OpenAI's (api-key) and Gemini's (x-goog-api-key), whether or not swapgate has keys
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    }
)
# Few: each may hold two bodies of max_bytes until the writer takes it.
BUFFER_CAPTURES = 64
COMPRESSION_LEVEL = 3

Headers = Sequence[tuple[bytes, bytes]] | Sequence[tuple[str, str]]

SCHEMA = """
CREATE TABLE IF NOT EXISTS captures (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    at REAL NOT NULL,
    model TEXT NOT NULL,
    "key" TEXT,
    status INTEGER NOT NULL,
    request_headers TEXT NOT NULL,
    request_body BLOB NOT NULL,
    request_size INTEGER NOT NULL,
    response_headers TEXT NOT NULL,
    response_body BLOB NOT NULL,
    response_size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS captures_request_id ON captures (request_id);
"""

_INSERT = (
    'INSERT INTO captures (request_id, at, model, "key", status, request_headers, request_body,'
    " request_size, response_headers, response_body, response_size)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_BEYOND_NEWEST = (
    "DELETE FROM captures WHERE id <= (SELECT id FROM captures ORDER BY id DESC LIMIT 1 OFFSET ?)"
)
_SELECT = (
    'SELECT request_id, at, model, "key", status, request_headers, request_body, request_size,'
    " response_headers, response_body, response_size FROM captures"
    " WHERE request_id = ? ORDER BY id DESC LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class _Message:
    """One side of an exchange, as kept: headers without secrets, the body cut short."""

    headers: list[tuple[str, str]]
    body: bytes
    size: int  # the body's length before it was cut


@dataclass(frozen=True, slots=True)
class _Capture:
    request_id: str
    at: float
    model: str
    key: str | None
    status: int
    request: _Message
    response: _Message
    keep: int  # the configuration's bound when it was taken


class Captures:
    """Request and response bodies kept on demand, in the activity log's database.

    ``get`` gives each body back byte for byte: ``body`` is the text when the bytes are valid
    UTF-8 (``base64`` false), otherwise their base64 (``base64`` true). ``size`` is the body's
    length before it was cut at ``max_bytes``; ``truncated`` says it was. Header values are
    decoded as Latin-1, as HTTP sends them, so bytes survive that way too.
    """

    def __init__(
        self,
        log: ActivityLog,
        config: CaptureConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        buffer_captures: int = BUFFER_CAPTURES,
    ) -> None:
        self._worker = log.worker
        self._config = config
        self._clock = clock
        self._pending: WriteBuffer[_Capture] = WriteBuffer(buffer_captures)
        self._worker.attach(SCHEMA, self._write_pending)

    @property
    def dropped(self) -> int:
        """Captures lost because the writer fell behind or the database was closed."""
        return self._pending.dropped

    def set_config(self, config: CaptureConfig | None) -> None:
        """Change what is captured from now on (a config reload); ``None`` turns capture off."""
        self._config = config

    @property
    def max_bytes(self) -> int:
        """How much of each body is kept now (0 while capture is off)."""
        return self._config.max_bytes if self._config is not None else 0

    def wants(self, model: str, key: str | None) -> bool:
        """Whether a request for ``model`` by the key named ``key`` is to be captured."""
        config = self._config
        return config is not None and config.wants(model, key)

    def store(
        self,
        request_id: str,
        *,
        model: str,
        key: str | None,
        request_headers: Headers,
        request_body: bytes,
        status: int,
        response_headers: Headers,
        response_body: bytes,
        sizes: tuple[int, int] | None = None,
    ) -> None:
        """Keep an exchange without waiting on the disk; ignored while capture is off.
        ``sizes``: the bodies' whole lengths, where the caller kept only their beginnings."""
        config = self._config  # one reading: a reload may swap it meanwhile
        if config is None:
            return
        whole = sizes or (len(request_body), len(response_body))
        request = _message(request_headers, request_body, config.max_bytes, whole[0])
        response = _message(response_headers, response_body, config.max_bytes, whole[1])
        at = self._clock()
        capture = _Capture(request_id, at, model, key, status, request, response, config.keep)
        self._pending.put(capture)

    async def get(self, request_id: str) -> dict[str, object] | None:
        """The newest capture of ``request_id``, decompressed; ``None`` when there is none."""
        # Decompressing on the worker thread keeps a megabyte's work off the event loop.
        return await self._worker.run(lambda db: _read(db, request_id))

    def _write_pending(self, connection: sqlite3.Connection, final: bool) -> None:
        captures = self._pending.take(seal=final)
        if not captures:
            return
        compressor = zstandard.ZstdCompressor(level=COMPRESSION_LEVEL)
        rows = [_row(capture, compressor) for capture in captures]
        try:
            with connection:
                connection.executemany(_INSERT, rows)
                connection.execute(_BEYOND_NEWEST, (captures[-1].keep,))
        except (sqlite3.Error, OSError):
            self._pending.lost(len(rows))  # a full or read-only disk
            raise


def _message(headers: Headers, body: bytes, max_bytes: int, size: int) -> _Message:
    kept = [(_text(name), _text(value)) for name, value in headers]
    public = [(name, value) for name, value in kept if name.lower() not in SECRET_HEADERS]
    return _Message(public, bytes(body[:max_bytes]), size)


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _row(capture: _Capture, compressor: zstandard.ZstdCompressor) -> tuple[object, ...]:
    request, response = capture.request, capture.response
    return (
        capture.request_id,
        capture.at,
        capture.model,
        capture.key,
        capture.status,
        json.dumps(request.headers),
        compressor.compress(request.body),
        request.size,
        json.dumps(response.headers),
        compressor.compress(response.body),
        response.size,
    )


def _read(connection: sqlite3.Connection, request_id: str) -> dict[str, object] | None:
    row = connection.execute(_SELECT, (request_id,)).fetchone()
    if row is None:
        return None
    found_id, at, model, key, status = row[:5]
    return {
        "request_id": found_id,
        "at": at,
        "model": model,
        "key": key,
        "status": status,
        "request": _describe_message(*row[5:8]),
        "response": _describe_message(*row[8:11]),
    }


def _describe_message(headers: str, compressed: bytes, size: int) -> dict[str, Any]:
    body = zstandard.ZstdDecompressor().decompress(compressed)
    return {
        "headers": json.loads(headers),
        **_describe_body(body),
        "size": size,
        "truncated": size > len(body),
    }


def _describe_body(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8"), "base64": False}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode("ascii"), "base64": True}
