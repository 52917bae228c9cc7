"""The gateway's OpenAPI document (``GET /openapi.json``, docs/compatibility.md, "The contract").

FastAPI describes the routes it serves: the admin API, ``/v1/models``, health, Ollama's catalog.
The proxied endpoints are a pure ASGI callable outside FastAPI (proxy/handler.py), so this
module describes them: the OpenAI, Responses, Anthropic and Ollama request shapes (their
required fields, and the fields swapgate itself reads; anything else goes to the engine as
sent), the headers swapgate reads and adds, and each error status with the body its dialect
gives. Every operation documents the errors it can answer with, in swapgate's own shape,
instead of FastAPI's 422 (swapgate answers 400).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from swapgate.proxy.endpoints import ENDPOINTS, Endpoint

_ERROR = {"$ref": "#/components/schemas/Error"}
_ANTHROPIC_ERROR = {"$ref": "#/components/schemas/AnthropicError"}
_OLLAMA_ERROR = {"$ref": "#/components/schemas/OllamaError"}
_REASONS = {
    400: "The request is malformed or names no model; the message says which field",
    401: "No key, or a key swapgate does not know",
    403: "The key may not use this model or route",
    404: "No such model (or path, instance, job, capture): the message lists what exists",
    405: "Another method is served here; the Allow header names it",
    408: "The client sent its body too slowly (server.request_read_timeout)",
    409: "Conflicts with what runs now (a model serving or swapping)",
    413: "The body is larger than server.max_body_bytes",
    429: "The key's rate or the model's queue is full; Retry-After says when to retry",
    500: "A fault of swapgate's own, logged with the request id",
    502: "The engine failed or refused swapgate's key",
    503: "No instance could serve in time (or swapgate is shutting down); Retry-After",
    504: "The engine stopped answering (stream_idle_timeout)",
}
# What every proxied request can be answered with besides its 200
_PROXIED_ERRORS = (400, 401, 403, 404, 408, 413, 429, 500, 502, 503, 504)
# Beyond 400 and 500, which any route can answer: by (method, path)
_ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("get", "/v1/models"): (401,),
    ("get", "/readyz"): (503,),
    ("post", "/admin/preload"): (404, 503),
    ("post", "/admin/unload"): (404, 409),
    ("post", "/admin/instances/{name}/drain"): (404,),
    ("post", "/admin/instances/{name}/undrain"): (404,),
    ("post", "/admin/jobs/{name}/run"): (404, 503),
    ("get", "/admin/captures/{request_id}"): (404,),
    ("get", "/ui/{name}"): (404,),
    ("get", "/api/tags"): (401,),
    ("get", "/api/ps"): (401,),
    ("post", "/api/show"): (401, 403, 404),
    ("post", "/api/pull"): (401, 403, 404, 503),
    ("get", "/models"): (401,),
    ("get", "/props"): (401, 403, 404),
    ("post", "/models/load"): (401, 403, 404, 503),
    ("post", "/models/unload"): (401, 403, 404, 409),
}
_ADMIN_ERRORS = (401, 403)

_REQUEST_HEADERS = [
    ("x-swapgate-max-wait", "Seconds (or 250ms, 2m) this request may wait for a swap or queue"),
    ("x-swapgate-priority", "interactive, default, batch or an integer (the key may cap it)"),
    ("x-swapgate-keepalive", "off: no early headers nor keep-alive bytes for this request"),
    (
        "x-swapgate-progress",
        "off or reasoning: whether a waiting stream is told the load's progress",
    ),
    ("x-swapgate-keep-alive", "Ollama's keep_alive: how long the model stays loaded idle"),
    ("x-request-id", "The request's id in logs and the activity log; made up if absent"),
]
_RESPONSE_HEADERS = {
    "x-request-id": "The request's id",
    "x-swapgate-route": "Where it went: an instance, relay:NAME, or pending in early headers",
    "x-swapgate-wait-ms": "How long it waited for a swap or the queue",
    "x-swapgate-model": "The model that answered, where it is not the one asked for",
    "x-swapgate-pool": "The pool of instances the prompt's length chose",
}


def contract(app: FastAPI) -> dict[str, Any]:
    """The whole document: FastAPI's routes with swapgate's errors, and the proxied ``/v1``."""
    document = get_openapi(
        title=app.title, version=app.version, description=__doc__, routes=app.routes
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in [n for n in schemas if n in ("HTTPValidationError", "ValidationError")]:
        del schemas[name]
    schemas.update(_COMPONENTS)
    paths = document.setdefault("paths", {})
    for path, item in paths.items():
        for method, operation in item.items():
            _own_errors(method, path, operation)
            for parameter in operation.get("parameters", ()):
                parameter["schema"] = _present(parameter.get("schema", {}))
    for endpoint in ENDPOINTS.values():
        paths[endpoint.path] = {"post": _proxied(endpoint)}
    return document


def install(app: FastAPI) -> None:
    """Serve ``contract(app)`` as ``/openapi.json``, built once, on first request."""
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not built:
            built.update(contract(app))
        return built

    app.openapi = openapi  # type: ignore[method-assign]


def _own_errors(method: str, path: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)  # swapgate answers a body or query it cannot read with 400
    codes = (400, 500, *_ROUTE_ERRORS.get((method, path), ()))
    if path.startswith("/admin/"):
        codes += _ADMIN_ERRORS
    ollama = path.startswith("/api/")  # Ollama's routes answer in its shape but a fault's 500
    for code in sorted(set(codes)):
        shape = _OLLAMA_ERROR if ollama and code != 500 else _ERROR
        responses.setdefault(str(code), _error_response(code, shape))


def _present(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter that may be left out is absent, never ``null``: a query string has no
    way to say null, so ``anyOf [X, null]`` is X."""
    options = schema.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) == 1:
            rest = {k: v for k, v in schema.items() if k != "anyOf"}
            return {**kept[0], **rest}
    return schema


def _error_response(code: int, schema: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _REASONS[code],
        "content": {"application/json": {"schema": schema}},
    }
    if code in (429, 503):
        seconds = {"schema": {"type": "integer"}, "description": "Seconds to wait"}
        response["headers"] = {"Retry-After": seconds}
    if code == 405:
        response["headers"] = {"Allow": {"schema": {"type": "string"}}}
    return response


def _proxied(endpoint: Endpoint) -> dict[str, Any]:
    error = {"anthropic": _ANTHROPIC_ERROR, "ollama": _OLLAMA_ERROR}.get(endpoint.protocol, _ERROR)
    ok = _answer(endpoint)
    ok["headers"] = {
        name: {"schema": {"type": "string"}, "description": text}
        for name, text in _RESPONSE_HEADERS.items()
    }
    responses = {"200": ok} | {str(code): _error_response(code, error) for code in _PROXIED_ERRORS}
    media = "multipart/form-data" if endpoint.multipart else "application/json"
    return {
        "operationId": endpoint.label,
        "summary": _SUMMARIES[endpoint.label],
        "tags": ["inference"],
        "parameters": [
            {
                "name": name,
                "in": "header",
                "required": False,
                "description": text,
                "schema": {"type": "string"},
            }
            for name, text in _REQUEST_HEADERS
        ],
        "requestBody": {
            "required": True,
            "content": {
                media: {"schema": {"$ref": f"#/components/schemas/{_BODIES[endpoint.label]}"}}
            },
        },
        "responses": responses,
    }


def _answer(endpoint: Endpoint) -> dict[str, Any]:
    description = "The engine's answer, passed through as it streams"
    anything: dict[str, Any] = {"type": "object"}
    if endpoint.label == "speech":
        return {
            "description": description,
            "content": {"audio/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    content: dict[str, Any] = {"application/json": {"schema": anything}}
    if endpoint.label == "transcriptions":
        content["text/plain"] = {"schema": {"type": "string"}}
    if endpoint.label in _STREAMS:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    if endpoint.streams_unless_told:  # Ollama's: NDJSON lines unless "stream": false
        content["application/x-ndjson"] = {"schema": {"type": "string"}}
    return {"description": description, "content": content}


_STREAMS = frozenset({"chat", "completions", "responses", "messages", "transcriptions"})
_SUMMARIES = {
    "chat": "OpenAI chat completions",
    "completions": "OpenAI completions",
    "embeddings": "OpenAI embeddings",
    "responses": "OpenAI Responses (translated to chat for engines that do not speak it)",
    "messages": "Anthropic Messages (translated to chat for engines that do not speak it)",
    "count_tokens": "Anthropic token counting",
    "rerank": "Rerank (llama.cpp, vLLM, Jina, Cohere shape)",
    "images": "OpenAI image generation",
    "speech": "OpenAI text to speech",
    "transcriptions": "OpenAI transcription: a multipart upload, streamed through",
    "ollama_chat": "Ollama chat (NDJSON unless stream is false), translated to chat completions",
    "ollama_generate": "Ollama generate, translated to chat (raw: completions)",
    "ollama_embed": "Ollama embed, translated to embeddings",
    "ollama_embeddings": "Ollama's older embeddings endpoint, translated to embeddings",
}


def _body(required: list[str], properties: dict[str, Any], title: str) -> dict[str, Any]:
    """A request shape: what swapgate reads is typed; anything else passes to the engine."""
    common = {
        "model": {"type": "string", "minLength": 1, "description": "A model or alias"},
        "stream": {"type": "boolean"},
        "keep_alive": {
            "anyOf": [{"type": "string"}, {"type": "number"}],
            "description": "Ollama's keep_alive: 5m, seconds, 0 (unload after), -1 (keep)",
        },
    }
    return {
        "title": title,
        "type": "object",
        "required": ["model", *required],
        "properties": common | properties,
        "additionalProperties": True,
    }


_TEXT_OR_PARTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]}
_MESSAGES = {"type": "array", "items": {"type": "object"}}
_COMPONENTS: dict[str, Any] = {
    "Error": {
        "title": "Error",
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "code": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                },
            }
        },
    },
    "OllamaError": {
        "title": "OllamaError",
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    },
    "OllamaChatRequest": _body(
        [],
        {"messages": _MESSAGES, "tools": _MESSAGES, "options": {"type": "object"}},
        "OllamaChatRequest",
    ),
    "OllamaGenerateRequest": _body(
        [],
        {"prompt": {"type": "string"}, "system": {"type": "string"}, "raw": {"type": "boolean"}},
        "OllamaGenerateRequest",
    ),
    "OllamaEmbedRequest": _body(["input"], {"input": _TEXT_OR_PARTS}, "OllamaEmbedRequest"),
    "OllamaEmbeddingsRequest": _body(
        ["prompt"], {"prompt": {"type": "string"}}, "OllamaEmbeddingsRequest"
    ),
    "AnthropicError": {
        "title": "AnthropicError",
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "ChatRequest": _body(
        ["messages"],
        {"messages": _MESSAGES, "max_tokens": {"type": "integer"}, "tools": _MESSAGES},
        "ChatRequest",
    ),
    "CompletionRequest": _body(["prompt"], {"prompt": _TEXT_OR_PARTS}, "CompletionRequest"),
    "EmbeddingRequest": _body(["input"], {"input": _TEXT_OR_PARTS}, "EmbeddingRequest"),
    "ResponsesRequest": _body(
        ["input"],
        {
            "input": _TEXT_OR_PARTS,
            "instructions": {"type": "string"},
            "max_output_tokens": {"type": "integer"},
        },
        "ResponsesRequest",
    ),
    "MessagesRequest": _body(
        ["messages", "max_tokens"],
        {"messages": _MESSAGES, "max_tokens": {"type": "integer"}, "system": _TEXT_OR_PARTS},
        "MessagesRequest",
    ),
    "CountTokensRequest": _body(["messages"], {"messages": _MESSAGES}, "CountTokensRequest"),
    "RerankRequest": _body(
        ["query", "documents"],
        {"query": {"type": "string"}, "documents": {"type": "array"}},
        "RerankRequest",
    ),
    "ImageRequest": _body(["prompt"], {"prompt": {"type": "string"}}, "ImageRequest"),
    "SpeechRequest": _body(
        ["input"], {"input": {"type": "string"}, "voice": {"type": "string"}}, "SpeechRequest"
    ),
    "TranscriptionRequest": {
        "title": "TranscriptionRequest",
        "type": "object",
        "required": ["model", "file"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "file": {"type": "string", "format": "binary"},
            "stream": {"type": "string", "enum": ["true", "false"]},
            "response_format": {"type": "string"},
        },
    },
}
_BODIES = {
    "chat": "ChatRequest",
    "completions": "CompletionRequest",
    "embeddings": "EmbeddingRequest",
    "responses": "ResponsesRequest",
    "messages": "MessagesRequest",
    "count_tokens": "CountTokensRequest",
    "rerank": "RerankRequest",
    "images": "ImageRequest",
    "speech": "SpeechRequest",
    "transcriptions": "TranscriptionRequest",
    "ollama_chat": "OllamaChatRequest",
    "ollama_generate": "OllamaGenerateRequest",
    "ollama_embed": "OllamaEmbedRequest",
    "ollama_embeddings": "OllamaEmbeddingsRequest",
}
