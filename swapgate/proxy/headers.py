"""Which headers travel, each way, and which swapgate adds or reads: the upstream's request
headers, the route and wait it tells the client, and a request's wait budget
(docs/compatibility.md, "Headers")."""

from __future__ import annotations

from collections.abc import Sequence

from swapgate.config.settings import parse_duration
from swapgate.errors import BadRequest

BUDGET_HEADER = b"x-swapgate-max-wait"

# Never forwarded (docs/compatibility.md, "Headers", says which engine each one matters to):
# hop-by-hop headers; every credential a client library sends (docs/compatibility.md, "Client →
# engine"); what swapgate sets itself (the body's length and type, the request id);
# ``accept-encoding``, since keep-alive bytes written before a compressed body would corrupt it;
# ``origin``, which Ollama answers with 403 unless it is on OLLAMA_ORIGINS; and vLLM's
# client-chosen data-parallel rank. Bytes, as ASGI gives header names (lower-case): filtering
# decodes only what is kept.
DROP_REQUEST = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"content-type",
        b"x-request-id",
        b"accept-encoding",
        b"authorization",
        b"proxy-authorization",
        b"x-api-key",
        b"api-key",
        b"x-goog-api-key",
        b"cookie",
        b"origin",
        b"x-data-parallel-rank",
    }
)
# Also what swapgate sets itself, so a client never gets it twice: the upstream's echo of
# ``x-request-id`` (llama-cpp-python, vLLM) and ``x-accel-buffering`` (llama.cpp, llama-swap).
DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"server",
        b"x-request-id",
        b"x-accel-buffering",
    }
)


JSON_BODY = (("content-type", "application/json"),)


def upstream_headers(
    scope_headers: list[tuple[bytes, bytes]],
    request_id: str,
    api_key: str | None,
    body: Sequence[tuple[str, str]] = JSON_BODY,
    *,
    anthropic: bool = False,
) -> list[tuple[str, str]]:
    """What goes upstream: the client's headers less ``DROP_REQUEST``, and swapgate's own.

    A body parsed as a JSON object goes as ``application/json`` whatever the client said:
    without it aiohttp would send ``application/octet-stream``, which vLLM and SGLang answer
    with 400, llama-swap with 404 and llama-cpp-python with 422. An upload says its own
    (``body``: its boundary and length). A Messages request to an upstream that speaks them
    (``anthropic``) carries the key as ``x-api-key`` too: Anthropic's API reads only that.
    """
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in scope_headers
        if name not in DROP_REQUEST
    ]
    headers.extend(body)
    headers.append(("x-request-id", request_id))
    if api_key:
        headers.append(("authorization", f"Bearer {api_key}"))
        if anthropic:
            headers.append(("x-api-key", api_key))
    return headers


def route_headers(route: str, waited: float) -> list[tuple[bytes, bytes]]:
    """Where a request went and how long it waited for a swap or the queue, in ms
    (docs/compatibility.md, "Engine → client"): on an answer, an error, and keep-alives'
    early headers (``pending``, while no route is final)."""
    return [
        (b"x-swapgate-route", route.encode()),
        (b"x-swapgate-wait-ms", str(round(waited * 1000)).encode()),
    ]


def wait_budget(headers: list[tuple[bytes, bytes]]) -> float | None:
    """``x-swapgate-max-wait``: how long this request may wait (docs/operations.md), if it says."""
    for name, value in headers:
        if name == BUDGET_HEADER:
            text = value.decode("latin-1").strip()
            try:
                seconds = parse_duration(text)
                if isinstance(seconds, int | float) and not isinstance(seconds, bool):
                    return float(seconds)
                raise ValueError(text)
            except ValueError:
                raise BadRequest(
                    f"x-swapgate-max-wait: {text!r} is not a duration; send e.g. 5s or 500ms"
                ) from None
    return None


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The value of header ``name`` (lower-case), trimmed and lower-cased; None if absent."""
    for key, value in headers:
        if key == name:
            return value.strip().lower()
    return None
