"""An Anthropic Messages, OpenAI Responses or Ollama request served by an upstream that speaks
only OpenAI's API.

The request goes to ``/v1/chat/completions`` as chat (``count_tokens`` as a one-token chat
whose usage counts the prompt), and the answer comes back in the client's API: a stream event
by event as its chunks arrive, a JSON body (or an upstream's error) once it is whole. What is
carried and what is dropped is swapgate/proxy/translate/anthropic.py's and responses.py's, listed in
docs/compatibility.md. Ollama's requests go to chat, completions or embeddings
(``OllamaTranslated``; swapgate/proxy/translate/ollama.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from swapgate.errors import UpstreamError
from swapgate.policy import pools
from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.translate import anthropic, ollama, responses
from swapgate.proxy.translate.anthropic_stream import StreamTranslator
from swapgate.proxy.translate.chat_stream import ChatStreamReader
from swapgate.proxy.translate.ollama_stream import OllamaStream
from swapgate.proxy.translate.responses_stream import ResponsesStream

CHAT_PATH = "/v1/chat/completions"
HEADER = (b"x-swapgate-translated", b"chat-completions")
# A chat completion's JSON answer is read whole to translate it; one larger than this is not
# a chat answer.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class WholeAnswer:
    """A non-streamed answer, read whole (at most ``MAX_ANSWER_BYTES``) to be translated."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > MAX_ANSWER_BYTES:
            raise UpstreamError(f"the upstream's answer exceeds {MAX_ANSWER_BYTES} bytes")
        self._chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self._chunks)

    def parsed(self, what: str) -> dict[str, Any]:
        """The body as a JSON object; ``what`` names it in the error when it is not one."""
        try:
            answer = json.loads(self.body())
        except ValueError:
            raise UpstreamError(f"the upstream's {what} is not JSON") from None
        if not isinstance(answer, dict):
            raise UpstreamError(f"the upstream's {what} is not a JSON object")
        return answer


class Translation(Protocol):
    """A request in one API sent upstream in OpenAI's, and its answer brought back."""

    path: str  # where it goes upstream

    def request(self, upstream_model: str, waited: float = 0.0) -> bytes:
        """The upstream's body; ``waited``: seconds the request waited for its model."""

    def answer_headers(
        self, status: int, event_stream: bool, headers: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]: ...

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: bytes) -> bytes: ...

    def close(self) -> bytes: ...


def translation(
    endpoint: Endpoint,
    payload: dict[str, Any],
    model: str,
    stream: bool,
    adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Translation:
    """The translation of ``endpoint``'s request (a 400 now for a body it cannot carry)."""
    if endpoint.protocol == "ollama":
        return OllamaTranslated(endpoint, payload, model, stream, adjust)
    return Translated(endpoint, payload, model, adjust)


class Translated:
    path = CHAT_PATH

    def __init__(
        self,
        endpoint: Endpoint,
        payload: dict[str, Any],
        model: str,
        adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """Translate the request now, so a body that cannot be carried is a 400 before any
        swap starts for it; ``adjust`` changes the chat body (the model's params the
        translation does not carry: swapgate/config/model_params.py)."""
        self._counting = endpoint.label == "count_tokens"
        self._responses = endpoint.protocol == "responses"
        self._custom = responses.custom_tools(payload) if self._responses else frozenset()
        if self._responses:
            self._chat = responses.to_chat(payload)
        elif self._counting:
            self._chat = anthropic.count_request(payload)
        else:
            self._chat = anthropic.to_chat(payload)
        if adjust is not None:
            self._chat = adjust(self._chat)
        self._model = model  # the name the client asked for, which its answer carries
        self._stream: ChatStreamReader | None = None
        self._status = 0
        self._whole = WholeAnswer()

    def request(self, upstream_model: str, waited: float = 0.0) -> bytes:
        return json.dumps({**self._chat, "model": upstream_model}, separators=(",", ":")).encode()

    def answer_headers(
        self, status: int, event_stream: bool, headers: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """Begin the answer: the upstream's ``headers`` less what the translation changes."""
        self._status = status
        streaming = event_stream and 200 <= status < 300
        if streaming:
            # what the stream reports as its input tokens until (unless) the engine counts them
            estimate = max(1, pools.prompt_tokens(self._chat))
            self._stream = (
                ResponsesStream(self._model, self._custom, estimate)
                if self._responses
                else StreamTranslator(self._model, estimate)
            )
        kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
        kind = b"text/event-stream" if streaming else b"application/json"
        return [*kept, (b"content-type", kind), HEADER]

    @property
    def finished(self) -> bool:
        """Whether a translated stream's last event was made: the client has its whole answer,
        whatever the upstream still sends (its ``[DONE]``, the end of its body)."""
        return self._stream is not None and self._stream.done

    def feed(self, chunk: bytes) -> bytes:
        if self._stream is not None:
            return self._stream.feed(chunk)
        self._whole.add(chunk)
        return b""

    def close(self) -> bytes:
        if self._stream is not None:
            return self._stream.close()
        body = self._whole.body()
        if not 200 <= self._status < 300:
            if self._responses:
                return responses.error_from_chat(self._status, body)
            return anthropic.error_from_chat(self._status, body)
        answer = self._whole.parsed("chat answer")
        if self._responses:
            translated = responses.from_chat(answer, self._model, self._custom)
        elif self._counting:
            translated = anthropic.count_answer(answer)
        else:
            translated = anthropic.from_chat(answer, self._model)
        return json.dumps(translated, separators=(",", ":")).encode()


class OllamaTranslated:
    """An Ollama request (``/api/chat``, ``/api/generate``, ``/api/embed``,
    ``/api/embeddings``) sent as OpenAI's; its answer as Ollama's JSON or NDJSON lines."""

    def __init__(
        self,
        endpoint: Endpoint,
        payload: dict[str, Any],
        model: str,
        stream: bool,
        adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self._kind = _OLLAMA_KINDS[endpoint.label]
        self.path = ollama.upstream_path(self._kind, payload)
        self._body = ollama.to_openai(self._kind, payload, stream)
        if adjust is not None:
            self._body = adjust(self._body)
        self._model = model
        self._times = ollama.Times()
        self._stream: OllamaStream | None = None
        self._status = 0
        self._whole = WholeAnswer()

    def request(self, upstream_model: str, waited: float = 0.0) -> bytes:
        self._times.send(waited)
        return json.dumps({**self._body, "model": upstream_model}, separators=(",", ":")).encode()

    def answer_headers(
        self, status: int, event_stream: bool, headers: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        self._status = status
        streaming = event_stream and 200 <= status < 300
        if streaming:
            self._stream = OllamaStream(self._kind, self._model, self._times)
        kept = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
        kind = b"application/x-ndjson" if streaming else b"application/json; charset=utf-8"
        return [*kept, (b"content-type", kind), HEADER]

    @property
    def finished(self) -> bool:
        return self._stream is not None and self._stream.done

    def feed(self, chunk: bytes) -> bytes:
        if self._stream is not None:
            return self._stream.feed(chunk)
        self._whole.add(chunk)
        return b""

    def close(self) -> bytes:
        if self._stream is not None:
            return self._stream.close()
        if not 200 <= self._status < 300:
            return ollama.error_from_upstream(self._status, self._whole.body())
        answer = self._whole.parsed("answer")
        if self._kind in ("embed", "embeddings"):
            made = ollama.from_embeddings(self._kind, answer, self._model, self._times)
        else:
            made = ollama.from_chat(self._kind, answer, self._model, self._times)
        return json.dumps(made, ensure_ascii=False, separators=(",", ":")).encode()


_OLLAMA_KINDS: dict[str, ollama.Kind] = {
    "ollama_chat": "chat",
    "ollama_generate": "generate",
    "ollama_embed": "embed",
    "ollama_embeddings": "embeddings",
}
