"""One request's progress as the data plane sees it: for its response headers, its access-log
line, its metrics, and its row in the activity log (docs/operations.md, "Activity")."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swapgate.activity.records import Placement, Row
from swapgate.control.memory.kv import Claim
from swapgate.control.routing.key_limits import Admission
from swapgate.control.routing.waiter import Routing
from swapgate.data.lease import Progress
from swapgate.errors import SwapgateError
from swapgate.metrics import UNKNOWN
from swapgate.policy.fallback_models import Reason as FallbackReason
from swapgate.policy.idle_timeout import RequestedTimeout
from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.translate.translated import Translation

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from opentelemetry.trace import Span

_PLACED: dict[str, Placement] = {"swap": "swap", "queued": "queued", "full": "full"}
TAIL = 4096  # bytes of the answer kept for its usage, which engines send last
# OpenAI's and Anthropic's counts, and Ollama's (``prompt_eval_count``, ``eval_count``)
_TOKENS = re.compile(
    rb'"(prompt|input|completion|output)_tokens"\s*:\s*(\d+)|"(prompt_eval|eval)_count"\s*:\s*(\d+)'
)
_IN = frozenset((b"prompt", b"input", b"prompt_eval"))


@dataclass(slots=True)
class ModelFallback:
    """A request's one chance to be answered by another model (docs/configuration.md,
    "Fallback models"; taken by swapgate/proxy/pipeline/fallback_models.py): the model it asked
    for, its ``fallbacks``, whether its key may use a model (``allowed``), the routing it would
    have for a model (``routing_for``: its pool, budget, class), its prompt's estimated tokens;
    once taken, the model that answers it and why."""

    model: str
    fallbacks: tuple[str, ...]
    allowed: Callable[[str], bool]
    routing_for: Callable[[str], Routing]
    prompt_tokens: int
    to: str | None = None
    reason: FallbackReason | None = None


@dataclass(slots=True)
class Exchange:
    """One request's progress, from its arrival to its last byte."""

    method: str
    endpoint: Endpoint
    request_id: str
    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.time)  # wall clock, for the activity log
    model: str = UNKNOWN
    route: str = "none"
    waited: float = 0.0
    failed: SwapgateError | None = None  # an error told in-band, after a committed 200
    # A Messages request as chat completions, for an upstream that does not speak Messages
    translation: Translation | None = None
    routing: Routing | None = None  # its pool and wait budget (docs/operations.md)
    # Keep-alives committed the 200 before the upstream answered: its x-swapgate-wait-ms is
    # the wait until then, and a stream tells the whole wait in a last comment.
    committed_early: bool = False
    key: str | None = None  # the name of the client's key (docs/keys.md), never the key
    sent: float = 0.0  # when the request went to its upstream (perf_counter): its TTFT's start
    first_byte: float = 0.0  # when the upstream's body began (perf_counter)
    prompt_tokens: int = 0  # a streamed request's prompt, estimated: its TTFT's band
    # Its place under its key's limits, given back at the end (then None)
    admission: Admission | None = None
    claim: Claim | None = None  # its engine slot (kv_keep), given back when it ends
    stream: bool = False
    progress: Progress | None = None  # where it was placed, and the swap it waited for
    tail: bytes = b""  # the answer's last bytes, while the activity log is on
    capture: Capture | None = None  # its headers and bodies, when captures want it
    # While tracing (swapgate/tracing/): its server span, and its upstream call's
    span: Span | None = None
    upstream_span: Span | None = None
    max_tokens: int | None = None  # as the request asked, for its span
    # Its keep_alive: how long the copy that serves it may then sit idle (policy/idle_timeout.py)
    keep_alive: RequestedTimeout | None = None
    # Its one chance to be answered by another model (proxy/pipeline/fallback_models.py)
    fallback: ModelFallback | None = None

    def keep_tail(self, chunk: bytes) -> None:
        self.tail = (self.tail + chunk)[-TAIL:]

    def usage(self) -> tuple[int | None, int | None]:
        """The tokens in and out its engine reported (the last usage in its answer's tail)."""
        tokens_in = tokens_out = None
        for named, number, ollama, counted in _TOKENS.findall(_usage(self.tail)):  # the last counts
            kind, count = (named, number) if named else (ollama, counted)
            if kind in _IN:
                tokens_in = int(count)
            else:
                tokens_out = int(count)
        return tokens_in, tokens_out

    def row(
        self,
        status: int,
        ended: float,
        usage: tuple[int | None, int | None],
        trace_id: str | None = None,
    ) -> Row:
        """Its row in the activity log, at ``ended`` (perf_counter), with its ``usage``:
        ``Activity``'s fields as a tuple, in their order (a tuple costs the request path a
        third of a dataclass)."""
        since = self.started
        return (
            self.request_id,
            self.arrived,
            self.key,
            self.model,
            self.endpoint.path,
            self.route.partition("/")[2] or None,
            self.placement(),
            _ms(self.sent - since) if self.sent else None,
            _ms(self.first_byte - since) if self.first_byte else None,
            _ms(ended - since),
            usage[0],
            usage[1],
            status,
            self.progress.swap_id if self.progress else None,
            self.failed.code if self.failed else "",
            self.stream,
            trace_id,
            self.fallback.model if self.fallback and self.fallback.to else None,
            self.fallback.reason if self.fallback else None,
        )

    def placement(self) -> Placement:
        """How it found its model; ``refused`` when it never had an upstream."""
        if self.route.startswith("relay/"):
            return "relayed"
        if self.progress is None or self.route == "none":
            return "refused"
        return _PLACED.get(self.progress.placement, "warm")


@dataclass(slots=True)
class Capture:
    """A captured request's headers and bodies as they pass: each body's first ``limit``
    bytes, and its whole length."""

    limit: int
    request_headers: list[tuple[bytes, bytes]]
    request_body: bytes
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    response_body: bytearray = field(default_factory=bytearray)
    response_size: int = 0

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.response_body)
        if room > 0:
            self.response_body += chunk[:room]
        self.response_size += len(chunk)


def _ms(seconds: float) -> float:
    """Milliseconds to a tenth: round(x, 1) costs 2.5x as much (it goes through a string)."""
    return round(seconds * 10_000) / 10


def _usage(tail: bytes) -> bytes:
    """The tail from just before its first token count on (a match begins at most 11 bytes
    before ``_tokens"``): an answer without one costs a byte scan, not a regular
    expression over 4 KiB on the event loop."""
    at = tail.find(b'_tokens"')
    if at < 0:
        at = tail.find(b'_count"')
    return tail[max(0, at - 16) :] if at >= 0 else b""
