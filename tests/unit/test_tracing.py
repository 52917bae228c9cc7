"""Traces (docs/operations.md, "Tracing"): the spans a request leaves, in the client's trace,
with the SDK's in-memory exporter in place of OTLP. The gateway and a simulated llama-swap run
in this process over real sockets; the simulator's requests are recorded to read the
``traceparent`` swapgate sent. tests/engine/test_traces.py checks the same against a real
trace backend, with vLLM's own spans."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
import pytest
import uvicorn
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from swapgate.config.loading import parse_config
from swapgate.config.settings import TracingConfig
from swapgate.control.loops.scheduler import PreloadScheduler
from swapgate.metrics import Metrics
from swapgate.server.app import SwapgateApp, create_app
from swapgate.sim.app import create_sim_app
from swapgate.sim.backend import SimConfig
from swapgate.tracing import endpoint_of, spans
from tests.unit.fakes import eventually, world

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Recorded:
    """An ASGI app that keeps each request's headers before passing it on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


async def serve(app: ASGIApp) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, ws="none")
    )
    task = asyncio.create_task(server.serve())
    assert await eventually(lambda: server.started, within=10)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@dataclass
class Traced:
    url: str
    app: SwapgateApp
    upstream: Recorded
    spans: InMemorySpanExporter

    def finished(self) -> list[ReadableSpan]:
        tracing = self.app.runtime.tracing
        assert tracing is not None
        tracing.queue.force_flush()
        return list(self.spans.get_finished_spans())


@pytest.fixture
async def traced(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Traced]:
    memory = InMemorySpanExporter()
    monkeypatch.setattr(spans, "exporter", lambda endpoint: memory)
    sim = Recorded(create_sim_app(SimConfig(models=("a", "b"), load_time=0.3, token_rate=200)))
    sim_server, sim_task, sim_url = await serve(sim)
    config = {
        "instances": [{"name": "gpu-a", "kind": "llama-swap", "url": sim_url}],
        "tracing": {"endpoint": "http://127.0.0.1:4318"},  # in memory instead, as patched
        "server": {"access_log": True},
        "activity": {"path": ":memory:"},
    }
    app = create_app(parse_config(config))
    server, task, url = await serve(app)
    try:
        yield Traced(url, app, sim, memory)
    finally:
        server.should_exit = sim_server.should_exit = True
        await task
        await sim_task


async def chat(url: str, traceparent: str | None, stream: bool = False) -> int:
    headers = {"traceparent": traceparent} if traceparent else {}
    message = {"role": "user", "content": "secret prompt"}
    body = {"model": "a", "messages": [message], "stream": stream}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as answer,
    ):
        await answer.read()
        return answer.status


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> set[str]:
    span_id = parent.context.span_id
    return {s.name for s in spans if s.parent is not None and s.parent.span_id == span_id}


async def test_a_request_that_waited_for_a_swap_is_one_trace_in_the_clients(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    with caplog.at_level(logging.INFO, "swapgate.access"):
        assert await chat(traced.url, parent) == 200
    finished = traced.finished()
    (request,) = named(finished, "chat a")
    assert request.kind is SpanKind.SERVER
    assert f"{request.context.trace_id:032x}" == CLIENT_TRACE
    assert request.parent is not None
    assert f"{request.parent.span_id:016x}" == CLIENT_SPAN
    assert children(finished, request) == {"swap wait a", "upstream instance/gpu-a", "swap a"}
    attributes = dict(request.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "a"
    assert attributes["swapgate.route"] == "swap"
    assert attributes["swapgate.instance"] == "gpu-a"
    assert isinstance(attributes["gen_ai.usage.output_tokens"], int)
    (swap,) = named(finished, "swap a")
    assert dict(swap.attributes or {})["swapgate.result"] == "ok"
    (wait,) = named(finished, "swap wait a")
    assert [link.context.span_id for link in wait.links] == [swap.context.span_id]
    (upstream,) = named(finished, "upstream instance/gpu-a")
    assert upstream.kind is SpanKind.CLIENT
    sent = traced.upstream.headers[-1]["traceparent"]
    assert sent == f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01", "the engine's parent"
    every = [str(v) for s in finished for v in (s.attributes or {}).values()]
    assert not any("secret prompt" in v for v in every), "no prompt in any attribute"
    assert f"trace={CLIENT_TRACE}" in caplog.text, "the access log names the trace"
    page = await traced.app.runtime.activity.query()
    assert [a.trace_id for _, a in page.rows] == [CLIENT_TRACE]


async def test_two_requests_that_shared_a_swap_link_the_same_swap_span(traced: Traced) -> None:
    statuses = await asyncio.gather(chat(traced.url, None), chat(traced.url, None, stream=True))
    assert list(statuses) == [200, 200]
    finished = traced.finished()
    (swap,) = named(finished, "swap a")
    waits = named(finished, "swap wait a")
    assert len(waits) == 2
    assert {link.context.span_id for w in waits for link in w.links} == {swap.context.span_id}
    requests = named(finished, "chat a")
    assert len({r.context.trace_id for r in requests}) == 2, "each request its own trace"
    assert swap.parent is not None
    assert swap.parent.span_id in {r.context.span_id for r in requests}, "under the first"


async def test_a_warm_request_has_no_wait_spans(traced: Traced) -> None:
    await chat(traced.url, None)
    traced.finished()
    traced.spans.clear()
    await chat(traced.url, None)
    finished = traced.finished()
    (request,) = named(finished, "chat a")
    assert dict(request.attributes or {})["swapgate.route"] == "warm"
    assert children(finished, request) == {"upstream instance/gpu-a"}


def test_the_endpoint_comes_from_the_config_then_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert endpoint_of(TracingConfig().endpoint) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    assert endpoint_of(None) == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/v1/traces")
    assert endpoint_of(None) == "http://tempo:4318/v1/traces"
    configured = TracingConfig(endpoint="http://jaeger:4318")
    assert endpoint_of(configured.endpoint) == "http://jaeger:4318/v1/traces"


def test_with_no_endpoint_the_sdk_is_never_imported() -> None:
    """Tracing off costs nothing: not even the OpenTelemetry SDK's import, nor the exporter's
    (FastAPI imports the API itself, where it is installed)."""
    code = (
        "import sys\n"
        "from swapgate.config.loading import parse_config\n"
        "from swapgate.server.app import create_app\n"
        "app = create_app(parse_config({'instances': [{'name': 'x', 'url': 'http://x'}],"
        " 'activity': {'enabled': False}}))\n"
        "assert app.runtime.tracing is None\n"
        "sdk = ('opentelemetry.sdk', 'opentelemetry.exporter')\n"
        "print(sorted(m for m in sys.modules if m.startswith(sdk)))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "SWAPGATE_STATE_DIR": "/tmp/swapgate-tracing-test"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_ui_url_must_say_where_the_trace_id_goes() -> None:
    with pytest.raises(ValueError, match=r"\{trace_id\}"):
        TracingConfig(ui_url="http://jaeger:16686/trace/")
    assert TracingConfig(ui_url="http://jaeger:16686/trace/{trace_id}").ui_url


class Stalled(SpanExporter):
    """A collector that takes nothing: each export fails."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.FAILURE


def test_a_collector_that_takes_nothing_costs_dropped_spans_counted_and_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spans, "QUEUE", 3)
    dropped = Counter("dropped", "", registry=CollectorRegistry())
    stalled = Stalled()
    queue = spans.SpanQueue(stalled, dropped)
    finished = [ReadableSpan(name=f"s{i}") for i in range(5)]
    with caplog.at_level(logging.WARNING, "swapgate.tracing"):
        for span in finished:
            queue.on_end(span)  # the request path: an append, never an export
        assert dropped._value.get() == 2, "past the queue's bound"
        queue.force_flush()
        assert dropped._value.get() == 5, "the batch the collector refused"
        queue.shutdown()
    assert stalled.calls >= 1
    warnings = [r for r in caplog.records if "trace spans dropped" in r.getMessage()]
    assert len(warnings) == 1, "one warning a minute, however many drops"


async def test_a_preload_run_is_a_span_and_the_swap_it_starts_is_its_child() -> None:
    memory = InMemorySpanExporter()
    tracing = spans.Tracing.build(memory, 1.0, Metrics())
    w = world(
        {
            "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
            "routing": {"min_residency": 0},
            "preloads": [{"name": "morning", "model": "a", "cron": "0 8 * * *"}],
        }
    )
    w.warm("x", "b")
    w.coordinator.log.tracing = tracing
    scheduler = PreloadScheduler(lambda: w.preloader, w.metrics, None, None, tracing)
    scheduler.replace(w.settings.preloads)
    assert (await scheduler.run("morning")).ok
    tracing.shutdown()
    finished = memory.get_finished_spans()
    (preload,) = named(finished, "preload morning")
    (swap,) = named(finished, "swap a")
    assert swap.parent is not None
    assert swap.parent.span_id == preload.context.span_id
    assert dict(swap.attributes or {})["swapgate.evicted"] == ("b",)
    assert dict(preload.attributes or {})["swapgate.result"] == "ok"
