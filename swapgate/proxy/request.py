"""What a client sent, as the proxy reads it: a JSON object, or an upload to stream through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive

from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.translate.translated import Translated
from swapgate.proxy.upload import Upload
from swapgate.proxy.wire import parse_request, read_body, with_model


async def read_request(
    receive: Receive, headers: list[tuple[bytes, bytes]], endpoint: Endpoint, limit: int
) -> Request:
    """Read the body (an upload: its head) and what it asks for; ``limit`` is max_body_bytes."""
    if endpoint.multipart:
        upload = await Upload.begin(receive, headers, limit)
        stream = upload.fields.get("stream", "").lower() == "true"
        return Request({}, b"", upload.fields["model"], stream, upload)
    body = await read_body(receive, limit)
    payload, model, stream = parse_request(body)
    return Request(payload, body, model, stream)


@dataclass(slots=True)
class Request:
    """What the client sent, as parsed: a JSON object and its bytes, or an upload to stream;
    and its translation for upstreams that need one (a Messages request)."""

    payload: dict[str, Any]
    body: bytes
    model: str  # as the client named it
    stream: bool
    upload: Upload | None = None
    translation: Translated | None = None

    def rename(self, model: str) -> None:
        """The model is called ``model`` from here on (an alias resolved)."""
        if self.upload is not None:
            self.upload.rename_model(model)
        else:
            self.body = with_model(self.payload, model)
            self.payload = {**self.payload, "model": model}

    def renamed(self, model: str) -> bytes:
        """The body for an upstream that calls the model ``model``; an upload is renamed as
        it stands, since it goes upstream once."""
        if self.upload is not None:
            self.upload.rename_model(model)
            return b""
        return with_model(self.payload, model)

    @property
    def replayable(self) -> bool:
        return self.upload is None or not self.upload.started

    def after_body(self, receive: Receive) -> Receive:
        """``receive`` for the disconnect watcher: an upload's body is the proxy's to read
        first, so its watcher starts listening once all of it came."""
        upload = self.upload
        if upload is None or upload.read.is_set():
            return receive

        async def after() -> Message:
            await upload.read.wait()
            return await receive()

        return after
