"""What a request leaves behind: its metrics, its access-log line, its row in the activity log,
its capture and its spans (docs/operations.md, "Activity" and "Tracing"; docs/metrics.md), and
what the control loops learn from it: its first byte's time and its serving for the engine's
decay watch (control/loops/decay.py), and the idle timeout it asked for the copy that served it
(control/loops/idle_unload.py). The pipeline reports to the records; only they know the loops."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from swapgate.activity.captures import Captures
from swapgate.activity.log import ActivityLog
from swapgate.control.loops.decay import DecayWatch
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Lease
from swapgate.metrics import Metrics
from swapgate.policy.idle_timeout import Tell, copy_told
from swapgate.proxy.exchange import Capture, Exchange
from swapgate.proxy.request import Request
from swapgate.tracing import Segment

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from swapgate.tracing.spans import Attribute, Tracing

log = logging.getLogger("swapgate.access")
# A request span's name, by endpoint: OpenTelemetry's GenAI operation names where they exist
OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "responses": "chat",
    "messages": "chat",
}
_WAITS = frozenset({"queued", "loading", "waking"})
# A request span's swapgate.route (warm, swap, queued, relay), by its activity placement
_ROUTES = {"relayed": "relay", "full": "queued"}


class RequestRecords:
    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        decay: DecayWatch,
        activity: ActivityLog | None,
        captures: Captures | None,
        tracing: Tracing | None = None,
        idle: Tell | None = None,
    ) -> None:
        """``activity``: where each request's row goes (none: the log is off); ``captures``:
        whose bodies are kept; ``tracing``: where spans go (none: off); ``idle``: told the idle
        timeout a served request asked for its copy (the idle unloader's ``asked``)."""
        self._idle = idle
        self.tracing = tracing
        self._registry = registry
        self._metrics = metrics
        self._decay = decay
        self.activity = activity
        self._captures = captures
        self.access_log = True  # server.access_log, set with each config

    def capture_for(
        self, ex: Exchange, headers: list[tuple[bytes, bytes]], request: Request
    ) -> Capture | None:
        """Where ``ex``'s headers and bodies go as they pass, if captures want them."""
        captures = self._captures
        if captures is None or not captures.wants(ex.model, ex.key):
            return None
        return Capture(captures.max_bytes, headers, request.body)

    def first_byte(self, ex: Exchange, lease: Lease, streamed: bool) -> None:
        """The upstream's first byte came (``ex.first_byte``): a stream's time to it from an
        instance, for the engine's decay watch."""
        if lease.kind == "instance" and streamed:
            since = self._registry.warm_since(lease.name, lease.model)
            if since is not None:
                ttft = ex.first_byte - ex.sent
                self._decay.ttft(lease.name, lease.model, since, ex.prompt_tokens, ttft)

    def released(self, ex: Exchange, lease: Lease | None) -> None:
        """The request let go of ``lease`` (before its end): the copy that served it may sit
        idle as long as the request asked (its ``keep_alive``)."""
        if ex.keep_alive is None or self._idle is None:  # it asked nothing
            return
        told = copy_told(ex.keep_alive, lease)
        if told is not None:
            self._idle(*told)

    def done(self, ex: Exchange, status: int, usage: tuple[int | None, int | None]) -> None:
        """Count, log and keep what ``ex`` left behind, once its answer is over; ``usage``:
        the tokens in and out its engine reported."""
        ended = time.perf_counter()
        elapsed = ended - ex.started
        if ex.sent and ex.route.startswith("instance/"):
            instance = ex.route.removeprefix("instance/")
            since = self._registry.warm_since(instance, ex.model)
            if since is not None:
                self._decay.served(instance, ex.model, since)
        self._metrics.request_done(ex.model, ex.route, status, elapsed, ex.waited)
        self._metrics.endpoint_done(ex.endpoint.label, status)
        if ex.routing is not None and ex.routing.pool is not None:
            self._metrics.pool_done(ex.model, ex.routing.pool.name, status, ex.waited)
        if ex.key is not None:
            self._metrics.key_done(ex.key, status)
        if usage != (None, None):
            self._metrics.tokens_spent(ex.key, ex.model, usage[0] or 0, usage[1] or 0)
        trace_id = None
        if ex.span is not None and self.tracing is not None:
            trace_id = self._trace(self.tracing, ex, status, usage)
        if self.access_log:
            log.info(
                '"%s %s" %d model=%s route=%s wait_ms=%d ms=%.1f id=%s key=%s%s',
                ex.method,
                ex.endpoint.path,
                status,
                ex.model,
                ex.route,
                round(ex.waited * 1000),
                elapsed * 1000,
                ex.request_id,
                ex.key or "-",
                f" trace={trace_id}" if trace_id else "",
            )
        if self.activity is not None:
            self.activity.record_row(ex.row(status, ended, usage, trace_id))
        if ex.capture is not None and self._captures is not None:
            self._store(ex, ex.capture, status)

    def _trace(
        self, tracing: Tracing, ex: Exchange, status: int, usage: tuple[int | None, int | None]
    ) -> str | None:
        """End the request's span, its waits made its children; its trace id, if sampled."""
        assert ex.span is not None
        span = ex.span
        span.update_name(f"{OPERATIONS.get(ex.endpoint.label, ex.endpoint.label)} {ex.model}")
        tracing.waits(span, ex.model, waits(ex))
        tracing.finish(span, request_attributes(ex, status, usage), _error(ex, status))
        ctx = span.get_span_context()
        return f"{ctx.trace_id:032x}" if ctx.trace_flags.sampled else None

    def _store(self, ex: Exchange, capture: Capture, status: int) -> None:
        assert self._captures is not None
        self._captures.store(
            ex.request_id,
            model=ex.model,
            key=ex.key,
            request_headers=capture.request_headers,
            request_body=capture.request_body,
            status=status,
            response_headers=capture.response_headers,
            response_body=bytes(capture.response_body),
            sizes=(len(capture.request_body), capture.response_size),
        )


def request_attributes(
    ex: Exchange, status: int, usage: tuple[int | None, int | None]
) -> dict[str, Attribute]:
    """A request span's attributes: OpenTelemetry's GenAI conventions, then swapgate's own.
    Never a prompt or an answer."""
    progress = ex.progress
    attributes: dict[str, Attribute] = {
        "gen_ai.operation.name": OPERATIONS.get(ex.endpoint.label, ex.endpoint.label),
        "gen_ai.request.model": ex.model,
        "http.request.method": ex.method,
        "url.path": ex.endpoint.path,
        "http.response.status_code": status,
        "swapgate.request_id": ex.request_id,
        "swapgate.route": _ROUTES.get(ex.placement(), ex.placement()),
        "swapgate.wait_ms": round(ex.waited * 1000),
        "swapgate.stream": ex.stream,
    }
    if ex.route.startswith("instance/"):
        attributes["swapgate.instance"] = ex.route.removeprefix("instance/")
        attributes["gen_ai.response.model"] = ex.model
    if ex.key is not None:
        attributes["swapgate.key"] = ex.key
    if progress is not None and progress.swap_id is not None:
        attributes["swapgate.swap_id"] = progress.swap_id
    if usage[0] is not None:
        attributes["gen_ai.usage.input_tokens"] = usage[0]
    if usage[1] is not None:
        attributes["gen_ai.usage.output_tokens"] = usage[1]
    if ex.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = ex.max_tokens
    return attributes


def upstream_attributes(lease: Lease) -> dict[str, Attribute]:
    """An upstream call's span: where it went (``server.address``: the instance or relay)."""
    host = lease.upstream.url.split("://", 1)[-1].split("/", 1)[0]
    address, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    attributes: dict[str, Attribute] = {
        "server.address": address,
        "swapgate.route": lease.route,
        "gen_ai.request.model": lease.upstream_model,
    }
    if port.isdigit():
        attributes["server.port"] = int(port)
    return attributes


def waits(ex: Exchange) -> list[Segment]:
    """Where the request waited, stretch by stretch (queued, for a swap), from its trail."""
    progress = ex.progress
    if progress is None or not progress.trail:
        return []
    ends = [when for _, when, _ in progress.trail[1:]] + [time.time_ns()]
    swap = progress.swap_span
    return [
        Segment(state, began, ended, instance, swap if state != "queued" else None)
        for (state, began, instance), ended in zip(progress.trail, ends, strict=True)
        if state in _WAITS
    ]


def _error(ex: Exchange, status: int) -> str:
    if ex.failed is not None:
        return ex.failed.code
    return f"status {status}" if status >= 500 else ""


def traced_upstream(
    tracing: Tracing | None, ex: Exchange, lease: Lease, headers: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The upstream call's span (the attempt before, if any, failed), and the headers that
    make it the parent of the engine's own spans (``traceparent``: vLLM's, for one)."""
    assert tracing is not None
    assert ex.span is not None
    if ex.upstream_span is not None:
        tracing.finish(ex.upstream_span, {}, "failed; the request went elsewhere")
    span = ex.upstream_span = tracing.child(ex.span, f"upstream {lease.route}", client=True)
    span.set_attributes(upstream_attributes(lease))
    kept = [(k, v) for k, v in headers if k.lower() not in ("traceparent", "tracestate")]
    return [*kept, ("traceparent", tracing.traceparent(span).decode())]
