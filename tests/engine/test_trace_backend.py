"""The real trace backend the trace tests read from (testbed/traces.py: MLflow's server, installed
once per machine): a span sent with OpenTelemetry's own SDK over OTLP/HTTP comes back through the
backend's query API with its parent, its link and its typed attributes as they were sent.

What this pins is the backend, not swapgate: the tests of swapgate's traces (SPEC §33) read
their spans the same way, so a backend that lost a link here would fail them for nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.util.types import AttributeValue

from testbed.traces import TraceBackend, ensure_trace_backend, trace_backend

pytestmark = pytest.mark.engine
SERVICE = "swapgate-backend-check"


@pytest.fixture(scope="session")
def mlflow() -> Path:
    return ensure_trace_backend()


@pytest.fixture
def backend(mlflow: Path, tmp_path: Path) -> Iterator[TraceBackend]:
    with trace_backend(mlflow, tmp_path / "traces") as running:
        yield running


def hex_ids(span: trace.Span) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_a_span_comes_back_with_its_parent_link_and_attributes(backend: TraceBackend) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    exporter = OTLPSpanExporter(endpoint=backend.traces_endpoint, headers=backend.headers)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test_trace_backend")
    # The shape swapgate sends: a swap in a trace of its own, linked from a request that
    # waited for it; the request's server span with a child for its upstream call.
    with tracer.start_as_current_span("swap tiny") as swap:
        pass
    link = trace.Link(swap.get_span_context(), {"swapgate.reason": "waited"})
    with tracer.start_as_current_span("chat tiny", kind=trace.SpanKind.SERVER) as request:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.usage.input_tokens": 12,
            "swapgate.route": "swap",
            "swapgate.wait_ms": 1.5,
            "swapgate.cached": True,
        }
        with tracer.start_as_current_span(
            "upstream", kind=trace.SpanKind.CLIENT, links=[link], attributes=attributes
        ) as upstream:
            upstream.set_attribute("swapgate.tiers", ["warm", "asleep"])
    provider.shutdown()

    trace_id, request_id = hex_ids(request)
    spans = {span.name: span for span in backend.traces(trace_id, at_least=2)}
    assert sorted(spans) == ["chat tiny", "upstream"]
    root, child = spans["chat tiny"], spans["upstream"]
    assert (root.span_id, root.parent_id) == (request_id, None)
    assert (child.trace_id, child.parent_id) == (trace_id, request_id)
    assert child.span_id == hex_ids(upstream)[1]
    assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    assert child.attributes == {**attributes, "swapgate.tiers": ["warm", "asleep"]}
    swap_trace, swap_span = hex_ids(swap)
    [linked] = child.links
    assert (linked.trace_id, linked.span_id) == (swap_trace, swap_span)
    assert linked.attributes == {"swapgate.reason": "waited"}
    assert child.service == SERVICE
    # The linked swap is a trace of its own, read back by its id.
    [alone] = backend.traces(swap_trace)
    assert (alone.name, alone.span_id, alone.parent_id, alone.links) == (
        "swap tiny",
        swap_span,
        None,
        (),
    )
    assert backend.ui_url(trace_id) == f"{backend.url}/#/experiments/0/traces/tr-{trace_id}"
    assert backend.traces("0" * 31 + "1", at_least=0) == []  # a trace it never saw
