"""An upload's head is read, its model renamed in place, the rest streamed unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from python_multipart.multipart import MultipartParser

from swapgate.errors import BadRequest, RequestTooLarge
from swapgate.proxy.upload import Upload

BOUNDARY = "b0undary"
TYPE = f"multipart/form-data; boundary={BOUNDARY}".encode()


def form(*parts: tuple[str, bytes, str | None]) -> bytes:
    body = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename:
            disposition += f'; filename="{filename}"'
        body += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        body += value + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


AUDIO = bytes(range(256)) * 64
BODY = form(
    ("model", b"whisper", None),
    ("response_format", b"text", None),
    ("file", AUDIO, "a.wav"),
    ("language", b"en", None),
)


def receiver(body: bytes, size: int, disconnect_at: int | None = None) -> Any:
    """An ASGI receive that hands out ``body`` in chunks of ``size`` bytes."""
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if disconnect_at is not None and sent == disconnect_at:
            return {"type": "http.disconnect"}
        chunk = chunks[sent]
        sent += 1
        return {"type": "http.request", "body": chunk, "more_body": sent < len(chunks)}

    return receive


def headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", TYPE), (b"content-length", str(len(body)).encode())]


async def streamed(upload: Upload) -> bytes:
    parts: AsyncIterator[bytes] = upload.stream()
    return b"".join([chunk async for chunk in parts])


@pytest.mark.parametrize("size", [1, 7, 64, 4096, len(BODY)])
def test_the_fields_before_the_file_are_read_and_the_body_streams_unchanged(size: int) -> None:
    async def run() -> tuple[Upload, bytes]:
        upload = await Upload.begin(receiver(BODY, size), headers(BODY), 1 << 20)
        return upload, await streamed(upload)

    upload, body = asyncio.run(run())
    assert upload.fields == {"model": "whisper", "response_format": "text"}  # not "language"
    assert body == BODY
    assert upload.read.is_set()
    assert upload.headers() == [("content-type", TYPE.decode()), ("content-length", str(len(BODY)))]


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_a_renamed_model_is_the_only_change_and_the_length_follows(size: int) -> None:
    async def run() -> tuple[Upload, bytes]:
        upload = await Upload.begin(receiver(BODY, size), headers(BODY), 1 << 20)
        upload.rename_model("whisper-large-v3")
        upload.rename_model("w")  # renamed twice: an alias, then the upstream's own name
        return upload, await streamed(upload)

    upload, body = asyncio.run(run())
    assert body == BODY.replace(b"\r\n\r\nwhisper\r\n", b"\r\n\r\nw\r\n", 1)
    assert upload.headers()[1] == ("content-length", str(len(body)))
    fields: dict[str, bytes] = {}
    parser = MultipartParser(BOUNDARY, _collector(fields))
    parser.write(body)
    assert fields["model"] == b"w"
    assert fields["file"] == AUDIO


def _collector(fields: dict[str, bytes]) -> Any:
    state: dict[str, Any] = {"name": None, "header": b"", "value": b"", "data": b""}

    def header_field(data: bytes, start: int, end: int) -> None:
        state["header"] += data[start:end]

    def header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def header_end() -> None:
        if state["header"].lower() == b"content-disposition":
            state["name"] = state["value"].split(b'name="')[1].split(b'"')[0].decode()
        state["header"] = state["value"] = b""

    def part_data(data: bytes, start: int, end: int) -> None:
        state["data"] += data[start:end]

    def part_end() -> None:
        fields[state["name"]] = state["data"]
        state["data"] = b""

    return {
        "on_header_field": header_field,
        "on_header_value": header_value,
        "on_header_end": header_end,
        "on_part_data": part_data,
        "on_part_end": part_end,
    }


@pytest.mark.parametrize(
    ("body", "content_type", "error", "says"),
    [
        (form(("file", AUDIO, "a.wav"), ("model", b"w", None)), TYPE, BadRequest, "model first"),
        (form(("language", b"en", None)), TYPE, BadRequest, "no 'model' field"),
        (BODY, b"application/json", BadRequest, "multipart/form-data"),
        (BODY, b"multipart/form-data", BadRequest, "multipart/form-data"),  # no boundary
        (
            form(("prompt", b"x" * 5000, None), ("model", b"w", None)),
            TYPE,
            RequestTooLarge,
            "before the file",
        ),
    ],
)
def test_forms_it_cannot_place_are_clear_errors(
    body: bytes, content_type: bytes, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        asyncio.run(Upload.begin(receiver(body, 512), [(b"content-type", content_type)], 4096))


def test_a_client_that_goes_away_mid_upload_is_told_apart_from_an_upstream_failure() -> None:
    async def run() -> Upload:
        upload = await Upload.begin(receiver(BODY, 256, disconnect_at=4), headers(BODY), 1 << 20)
        with pytest.raises(ConnectionAbortedError):
            await streamed(upload)
        return upload

    upload = asyncio.run(run())
    assert upload.gone
    assert upload.started
