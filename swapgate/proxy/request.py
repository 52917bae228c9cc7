"""What a client sent, as the proxy reads it: a JSON object, or an upload to stream through."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive

from swapgate.config.model_params import Params, params_for
from swapgate.errors import BadRequest, RequestTooLarge
from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.translate.translated import Translation, translation
from swapgate.proxy.upload import Upload


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
    if endpoint.streams_unless_told:
        stream = payload.get("stream") is not False
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
    translation: Translation | None = None
    sent: dict[str, Any] | None = None  # the client's body, once a model's params changed it

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

    def change(self, rule: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        """The body as ``rule`` makes it (a model's params: swapgate/config/model_params.py)
        from what the client sent, named as it is now: a fallback model's rule replaces the
        asked model's. None: as the client sent it. An upload goes as sent."""
        if self.upload is not None or (rule is None and self.sent is None):
            return
        if self.sent is None:
            self.sent = self.payload
        payload = {**self.sent, "model": self.payload.get("model")}
        self.payload = rule(payload) if rule is not None else payload
        self.body = json.dumps(self.payload, separators=(",", ":")).encode()

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


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("the client went away while sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(
                f"the request body exceeds server.max_body_bytes ({limit} bytes); send less"
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_request(body: bytes) -> tuple[dict[str, Any], str, bool]:
    """The JSON object, its ``model`` and whether it asks for a stream."""
    try:
        payload = json.loads(body, parse_constant=_not_json)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply to parse; send a flatter object") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object with a 'model' field")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is missing or not a string; name the model", param="model")
    return payload, model, payload.get("stream") is True


def _not_json(constant: str) -> None:
    # Python's json reads NaN and Infinity; JSON has neither, and engines reject them (or
    # worse, take them): a 400 here, like any other body that is not JSON.
    raise ValueError(f"{constant} is not a JSON value")


def with_model(payload: dict[str, Any], model: str) -> bytes:
    return json.dumps({**payload, "model": model}, separators=(",", ":")).encode()


def with_fields(body: bytes, **fields: Any) -> bytes:
    """A JSON body with ``fields`` set (an engine's slot: ``id_slot``)."""
    return json.dumps({**json.loads(body), **fields}, separators=(",", ":")).encode()


def shape(request: Request, rules: Mapping[str, Params], endpoint: Endpoint, model: str) -> None:
    """The body as ``model``'s params make it from what the client sent (docs/configuration.md,
    "Request parameters per model"), and its translation for an upstream that speaks chat only:
    the params a translation does not carry go into the chat body."""
    rule = params_for(rules, model, endpoint.label)
    request.change(rule.apply if rule is not None else None)
    if endpoint.protocol != "openai":
        into_chat = rule.into_chat(endpoint.protocol) if rule is not None else None
        request.translation = translation(
            endpoint, request.payload, model, request.stream, into_chat
        )
