"""The spans swapgate makes, with the OpenTelemetry SDK (imported only when tracing is on:
swapgate/tracing/__init__.py), and the bounded queue that exports them off the event loop."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import Counter

from swapgate import __version__
from swapgate.metrics import Metrics
from swapgate.tracing.segment import Segment

log = logging.getLogger("swapgate.tracing")
QUEUE = 4096  # finished spans waiting for export; past it, new ones are dropped
BATCH = 512  # spans per export call
EXPORT_EVERY = 2.0  # seconds between exports of a batch that is not full
WARN_EVERY = 60.0  # seconds between two warnings about dropped spans
Headers = Sequence[tuple[bytes, bytes]]
Attribute = str | int | float | bool | Sequence[str]


def exporter(endpoint: str) -> SpanExporter:
    """OTLP over HTTP to ``endpoint``; headers, timeout and compression come from the standard
    ``OTEL_EXPORTER_OTLP_*`` variables, as every OpenTelemetry exporter reads them."""
    return OTLPSpanExporter(endpoint=endpoint)


# The OTLP exporter logs each retry and each batch it gives up on, four lines every ~12 s while
# a collector is down: their text becomes the reason of swapgate's one warning a minute instead
EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
)


class Reasons(logging.Filter):
    """Keeps the exporter's first complaint since it was last read (the cause: a refused
    connection, a 401; its later lines say it gave up), and lets none through to the log."""

    def __init__(self) -> None:
        super().__init__()
        self._first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        self._first = self._first or record.getMessage()[:300]
        return False

    def take(self) -> str:
        first, self._first = self._first, ""
        return first


class SpanQueue(SpanProcessor):
    """A bounded queue of finished spans and the thread that exports them in batches: the
    request path only appends (``on_end``), whatever the collector does."""

    def __init__(self, exporter: SpanExporter, dropped: Counter) -> None:
        self._exporter = exporter
        self._dropped = dropped
        self._spans: collections.deque[ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._warned = -WARN_EVERY
        self._lock = threading.Lock()  # one export at a time: the thread's, or a flush
        self._reasons = Reasons()
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._reasons)
        self._thread = threading.Thread(target=self._run, name="swapgate-traces", daemon=True)
        self._thread.start()

    def on_end(self, span: ReadableSpan) -> None:
        if len(self._spans) >= QUEUE:
            self._drop(1, "the export queue is full")
            return
        self._spans.append(span)
        if len(self._spans) >= BATCH:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(EXPORT_EVERY)
            self._wake.clear()
            self._export_all()

    def _export_all(self) -> None:
        with self._lock:
            while self._spans:
                batch = [self._spans.popleft() for _ in range(min(BATCH, len(self._spans)))]
                try:
                    result = self._exporter.export(batch)
                except Exception as exc:  # the exporter's own fault: the spans are lost
                    self._drop(len(batch), f"the export failed: {exc!r}")
                    continue
                if result is not SpanExportResult.SUCCESS:
                    why = self._reasons.take() or "the collector did not take them"
                    self._drop(len(batch), why)

    def _drop(self, count: int, why: str) -> None:
        self._dropped.inc(count)
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning("trace spans dropped (%s); swapgate_trace_spans_dropped_total counts", why)

    def shutdown(self) -> None:
        """Export what is queued (within the exporter's own timeout), then stop."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=15)
        self._export_all()
        self._exporter.shutdown()
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self._reasons)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export_all()
        return True


class Tracing:
    """The gateway's tracer: spans for requests, their waits, swaps and upstream calls."""

    def __init__(self, provider: TracerProvider, queue: SpanQueue) -> None:
        self._provider = provider
        self.queue = queue
        self.tracer = provider.get_tracer("swapgate", __version__)
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def build(cls, exporter: SpanExporter, ratio: float, metrics: Metrics) -> Tracing:
        """Spans sampled by their parent's decision, else at ``ratio``; the resource named by
        OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (``swapgate`` when neither names it)."""
        resource = Resource.create({"service.version": __version__})
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "swapgate"}))
        provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
        queue = SpanQueue(exporter, metrics.trace_spans_dropped)
        provider.add_span_processor(queue)
        return cls(provider, queue)

    def request(self, headers: Headers, name: str) -> Span:
        """A request's server span, in the client's trace when it sent ``traceparent``."""
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in headers
            if k in (b"traceparent", b"tracestate")
        }
        parent = self._propagator.extract(carrier) if carrier else None
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER)

    @contextmanager
    def current(self, span: Span) -> Iterator[None]:
        """``span`` is the current one within: swaps and saves started meanwhile are its
        children (their tasks copy the context)."""
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    @staticmethod
    def enter(span: Span) -> None:
        """``span`` is the current one for the rest of this task (a swap's own task: what it
        does next, its kv saves, are its children); the task's context ends with it."""
        context.attach(trace.set_span_in_context(span))

    def child(self, parent: Span, name: str, client: bool = False) -> Span:
        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        return self.tracer.start_span(name, trace.set_span_in_context(parent), kind)

    def waits(self, parent: Span, model: str, segments: Sequence[Segment]) -> None:
        """The request's waits, as children of its span: ``queue {model}`` and ``swap wait
        {model}``, the latter linked to the swap it waited for."""
        within = trace.set_span_in_context(parent)
        for s in segments:
            name = f"queue {model}" if s.state == "queued" else f"swap wait {model}"
            links = [Link(s.swap)] if s.swap is not None else []
            span = self.tracer.start_span(name, within, links=links, start_time=s.began)
            if s.instance is not None:
                span.set_attribute("swapgate.instance", s.instance)
            span.end(s.ended)

    def span(
        self, name: str, attributes: dict[str, Attribute], parent: Context | None = None
    ) -> Span:
        """Any other span (a swap, a preload job, a kv_keep save or restore): a child of the
        current span (``parent``: of that context's), a root where there is none."""
        span = self.tracer.start_span(name, parent)
        span.set_attributes(attributes)
        return span

    @staticmethod
    def finish(span: Span, attributes: dict[str, Attribute], error: str = "") -> None:
        """End ``span`` with ``attributes``; failed, with ``error``, when one is given."""
        span.set_attributes(attributes)
        if error:
            span.set_status(trace.StatusCode.ERROR, error)
        span.end()

    @staticmethod
    def traceparent(span: Span) -> bytes:
        """The W3C ``traceparent`` that makes ``span`` the parent of the upstream's own."""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}".encode()

    def shutdown(self) -> None:
        self._provider.shutdown()


def trace_id(span: Span | None) -> str | None:
    """The span's trace id in hex, as backends show it; None for none, or one not sampled."""
    if span is None:
        return None
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.trace_flags.sampled else None


@contextmanager
def spanning(span: Span) -> Iterator[Span]:
    """``span`` ended when the block does; an exception marks it failed on the way out."""
    try:
        yield span
    except BaseException as exc:
        span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
        raise
    finally:
        span.end()
