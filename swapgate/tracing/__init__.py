"""OpenTelemetry traces (docs/operations.md, "Tracing"): a request, its wait for a swap, the
swap itself and the engine's answer, in the client's trace.

``tracing_for(config, metrics)`` is None unless an OTLP endpoint is set (``tracing.endpoint``,
else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``): then nothing of
it runs on the request path, and the OpenTelemetry SDK is not even imported. With one, the SDK
(swapgate/tracing/spans.py) makes the spans, and finished ones go into a bounded queue that a
thread exports in batches, so a collector that is down or slow costs the request path one
append: a span that finds the queue full, or a batch the collector refused, is dropped and
counted (``swapgate_trace_spans_dropped_total``), with one warning a minute.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from swapgate.tracing.segment import Segment

if TYPE_CHECKING:
    from swapgate.metrics import Metrics
    from swapgate.tracing.spans import Tracing

__all__ = ["ENDPOINT_ENV", "Segment", "endpoint_of", "tracing_for"]
ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def endpoint_of(configured: str | None) -> str | None:
    """Where spans go: the config's base URL (``tracing.endpoint``), else the standard
    variables; None: nowhere."""
    if configured:
        return configured.rstrip("/") + "/v1/traces"
    traces, base = (os.environ.get(name) for name in ENDPOINT_ENV)
    if traces:
        return traces
    return base.rstrip("/") + "/v1/traces" if base else None


def tracing_for(configured: str | None, sample_ratio: float, metrics: Metrics) -> Tracing | None:
    """The app's tracing (``tracing.endpoint``, ``tracing.sample_ratio``), or None when no
    endpoint is set anywhere (no SDK, no cost)."""
    endpoint = endpoint_of(configured)
    if endpoint is None:
        return None
    from swapgate.tracing.spans import Tracing, exporter

    return Tracing.build(exporter(endpoint), sample_ratio, metrics)
