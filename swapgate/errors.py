"""swapgate's exceptions and their one mapping to OpenAI-shaped HTTP errors (docs/operations.md).

    SwapgateError               an answer to a client: status, type, code, message
    ├── BadRequest              400 invalid_request_error  (malformed JSON, no string "model")
    ├── Unauthorized            401 invalid_api_key
    ├── Forbidden               403 forbidden              (a viewer's token asked to change)
    │   └── ModelNotAllowed     403 model_not_allowed      a model outside the key's scope
    ├── ModelNotFound           404 model_not_found        (names the known models)
    ├── PathNotFound            404 not_found
    ├── MethodNotAllowed        405 method_not_allowed
    ├── Conflict                409 conflict               (admin: the operation clashes with state)
    ├── RequestTimeout          408 request_timeout        the client sent too slowly (connection)
    ├── RequestTooLarge         413 request_too_large
    ├── HeadersTooLarge         431 headers_too_large      (connection layer)
    ├── QueueFull               429 queue_full             (+ Retry-After)
    ├── RateLimited             429 rate_limited           a key's limit (+ Retry-After)
    ├── UpstreamError           502 upstream_error
    │   ├── UpstreamUnreachable     the connection failed before any byte was sent
    │   │   └── UpstreamClosed          it closed after the request went out, with no answer
    │   └── UpstreamRefusedKey      the instance answered 401/403 to swapgate's own key
    ├── NoCapacity              503 no_capacity            (+ Retry-After)
    │   ├── SwapFailed          503 swap_failed            the swap a request waited for failed
    │   └── TooManyConnections      server.max_connections reached (connection layer)
    ├── ShuttingDown            503 shutting_down          told in-band when shutdown_grace ends
    ├── UpstreamTimeout         504 upstream_timeout
    │   └── InstanceDown        504 instance_down          declared down while it held the request
    └── InternalError           500 internal_error         anything unforeseen, logged
    DriverError                 a control-plane call to an instance failed (poll, load, unload)
    ├── DriverTimeout               it sent no answer in time (busy, or gone)
    └── DriverUnreachable           no connection to it (refused, reset, no route)

Messages say what to do next and never carry keys or tokens.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar


class SwapgateError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "swapgate_error"
    code: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            headers.append((b"retry-after", str(self.retry_after).encode()))
        return headers


class BadRequest(SwapgateError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request_error"


class Unauthorized(SwapgateError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(SwapgateError):
    status = 403
    type = "invalid_request_error"
    code = "forbidden"


class ModelNotAllowed(Forbidden):
    """A model outside the key's scope: the same answer whether or not the model exists."""

    code = "model_not_allowed"


class ModelNotFound(SwapgateError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PathNotFound(SwapgateError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(SwapgateError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(SwapgateError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class RequestTimeout(SwapgateError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class RequestTooLarge(SwapgateError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLarge(SwapgateError):
    status = 431
    type = "invalid_request_error"
    code = "headers_too_large"


class QueueFull(SwapgateError):
    status = 429
    code = "queue_full"


class RateLimited(SwapgateError):
    status = 429
    code = "rate_limited"


class UpstreamError(SwapgateError):
    status = 502
    code = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    """The connection failed before any byte was sent; ``host_down``: refused or no route (the
    instance is not there), not this side's trouble (out of descriptors or ports)."""

    host_down = False


class UpstreamClosed(UpstreamUnreachable):
    """The connection closed after the request went out, with no answer: a kept-alive
    connection the upstream was closing, or an engine that died while it held the request.
    ``unread``: the upstream reset it (or it was gone before the request was written), which a
    socket does when it closes with bytes still unread: it never read the whole request."""

    def __init__(self, message: str, unread: bool = False) -> None:
        super().__init__(message)
        self.unread = unread


class UpstreamRefusedKey(UpstreamError):
    """A 401/403 from an upstream is about swapgate's key for it, never the client's (which
    never travels): passing it on would read as "your key is wrong"."""


class NoCapacity(SwapgateError):
    status = 503
    code = "no_capacity"


class SwapFailed(NoCapacity):
    code = "swap_failed"


class ModelFailing(SwapFailed):
    """The model's loads fail fleet-wide: answered at once until its next probe load
    (docs/operations.md, "When part of the fleet breaks")."""

    code = "model_failing"


class TooManyConnections(NoCapacity):
    """More client connections than ``server.max_connections``: this one is answered and closed."""


class ShuttingDown(SwapgateError):
    status = 503
    code = "shutting_down"


class UpstreamTimeout(SwapgateError):
    status = 504
    code = "upstream_timeout"


class InstanceDown(UpstreamTimeout):
    """The instance was declared down while it held the request, before its first byte: it
    may have run it, so it is not sent elsewhere."""

    code = "instance_down"


class InternalError(SwapgateError):
    """A fault of swapgate's own: the client gets this, the log gets the cause."""


class DriverError(Exception):
    """An instance's control API failed or answered something unexpected."""


class DriverTimeout(DriverError):
    """An instance's control API sent no answer in time: busy, or gone."""


class DriverUnreachable(DriverError):
    """No connection to an instance's control API: nothing listens, or it went away."""


# What an engine says may name the machine's files and environment; clients see neither.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)*[\w.@+-]+")
_ASSIGNMENT = re.compile(r"\b([A-Z][A-Z0-9_]{2,})=\S+")
SHOWN_LINES = 10


def shown_to_clients(text: str, lines: int = SHOWN_LINES) -> str:
    """``text`` (a failed load's error: an engine's last lines) as clients may read it: its
    last ``lines`` lines, each file path as its last part (``…/model.gguf``), each
    ``NAME=value`` as ``NAME=…``."""
    kept = text.splitlines()
    head, tail = kept[:1], kept[1:][-lines:]
    shown = "\n".join(head + (["…"] if len(kept) - 1 > lines else []) + tail)
    shown = _PATH.sub(lambda m: "…/" + m.group(0).rsplit("/", 1)[1], shown)
    return _ASSIGNMENT.sub(r"\1=…", shown)
