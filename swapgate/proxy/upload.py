"""A multipart upload (``/v1/audio/transcriptions``), streamed through rather than held.

Only the form's fields before its first file are read: ``model`` must be among them (the
openai SDK and curl ``-F`` in the usual order put fields first), and they are held up to
``max_body_bytes``. The bytes read so far and then the rest of the upload go upstream as they
arrive, unchanged but for the model's name where swapgate maps it. python-multipart, which
Starlette's forms use, parses the head: its grammar is easy to get subtly wrong by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.types import Receive

from swapgate.errors import BadRequest, RequestTooLarge

if TYPE_CHECKING:  # declared for type checkers only
    from python_multipart.multipart import MultipartCallbacks

# Transcription formats that are not JSON: keep-alive whitespace would be part of the text.
PLAIN_FORMATS = frozenset({"text", "srt", "vtt"})


class _Head:
    """python-multipart's callbacks, collecting the fields before the first file part."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}
        self.spans: dict[str, tuple[int, int]] = {}  # a field's value: where it is in the body
        self.done = False  # a file part began, or the form ended
        self.offset = 0  # where the chunk being parsed starts in the body
        self._header = b""
        self._value = b""
        self._name: str | None = None
        self._data = bytearray()
        self._span: tuple[int, int] | None = None

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _begin(self) -> None:
        self._name, self._data, self._span = None, bytearray(), None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        if self._header.lower() == b"content-disposition" and not self.done:
            _, options = parse_options_header(self._value)
            if b"filename" in options:
                self.done = True
            else:
                self._name = options.get(b"name", b"").decode("utf-8", "replace")
        self._header = self._value = b""

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is None or self.done:
            return
        self._data += data[start:end]
        first = self._span[0] if self._span else self.offset + start
        self._span = (first, self.offset + end)

    def _part_end(self) -> None:
        if self._name is not None and not self.done:
            self.fields[self._name] = self._data.decode("utf-8", "replace")
            self.spans[self._name] = self._span or (0, 0)
        self._name = None

    def _end(self) -> None:
        self.done = True


class Upload:
    """The head of an upload, read; its body, to stream once (``stream``)."""

    def __init__(self, receive: Receive, head: bytes, fields: dict[str, str], length: int | None):
        self.fields = fields
        self.length = length  # the body's length, if the client sent one (else it is chunked)
        self.started = False  # some of it went upstream: it cannot go to another instance
        self.gone = False  # the client went away before all of it came
        self.read = asyncio.Event()  # the client sent all of it
        self._receive = receive
        self._head = head
        self._content_type = ""
        self._spans: dict[str, tuple[int, int]] = {}

    @classmethod
    async def begin(
        cls, receive: Receive, headers: list[tuple[bytes, bytes]], limit: int
    ) -> Upload:
        content_type, length = b"", None
        for name, value in headers:
            if name == b"content-type":
                content_type = value
            elif name == b"content-length" and value.strip().isdigit():
                length = int(value)
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise BadRequest("send this endpoint multipart/form-data with a 'model' field")
        head = _Head()
        parser = MultipartParser(boundary, head.callbacks())
        chunks: list[bytes] = []
        more = True
        while not head.done and more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionAbortedError("the client went away while sending its upload")
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if head.offset + len(chunk) > limit:
                raise RequestTooLarge(
                    f"the form's fields before its file exceed server.max_body_bytes ({limit}"
                    " bytes); send the 'model' field before the file"
                )
            parser.write(chunk)
            chunks.append(chunk)
            head.offset += len(chunk)
        if not isinstance(head.fields.get("model"), str) or not head.fields["model"]:
            raise BadRequest(
                "the form has no 'model' field before its file; send model first", param="model"
            )
        upload = cls(receive, b"".join(chunks), head.fields, length)
        upload._spans = head.spans
        upload._content_type = content_type.decode("latin-1")
        if not more:
            upload.read.set()
        return upload

    def headers(self) -> list[tuple[str, str]]:
        """The body's own headers upstream: its boundary, and its length unless it is chunked."""
        headers = [("content-type", self._content_type)]
        if self.length is not None:
            headers.append(("content-length", str(self.length)))
        return headers

    def rename_model(self, name: str) -> None:
        """Send ``name`` as the model instead of what the client wrote (an alias, a mapping)."""
        start, end = self._spans["model"]
        encoded = name.encode()
        self._head = self._head[:start] + encoded + self._head[end:]
        if self.length is not None:
            self.length += len(encoded) - (end - start)
        self._spans["model"] = (start, start + len(encoded))
        self.fields["model"] = name

    async def stream(self) -> AsyncIterator[bytes]:
        """The whole body, once: the head read so far, then the rest as the client sends it."""
        self.started = True
        yield self._head
        while not self.read.is_set():
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise ConnectionAbortedError("the client went away during its upload")
            if not message.get("more_body", False):
                self.read.set()
            chunk: bytes = message.get("body", b"")
            if chunk:
                yield chunk
