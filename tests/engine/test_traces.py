"""swapgate's traces in a real trace backend (docs/operations.md, "Tracing"; testbed/traces.py:
MLflow's server, started here and read back through its own query API and its own UI).

What a user with a trace backend sees: the request their application traced comes back as one
trace, their span with swapgate's under it: the request (``chat a``), the time it waited for a
swap (``swap wait a``, linked to the swap), the swap itself (``swap a``) and the call to the
engine (``upstream instance/gpu-a``). Two requests that waited for the same swap link the same
swap span; a streamed Anthropic Messages request and a Responses request trace as chat does. A
real vLLM that traces hangs its own ``llm_request`` span under swapgate's ``upstream`` span, in
the same trace. MLflow's UI shows the swap's trace (the screenshot in docs/operations.md,
written again with ``SWAPGATE_SCREENSHOT=1``).

The backend itself is checked first (a span sent with OpenTelemetry's own SDK comes back with
its parent, its link and its typed attributes as they were sent): the tests of swapgate's traces
read their spans the same way, so a backend that lost a link would fail them for nothing. One
MLflow server serves the whole file (its start is ~7 s of CPU).

The client here is an application that traces with OpenTelemetry's own SDK, as a user's would:
its span around each call, exported to the same backend, and ``traceparent`` on the request.
The gateway's spans reach the backend up to 2 s after they end (its export interval), vLLM's
when its batch goes: each read waits for as many spans as the check needs, within
``TRACE_WAIT``. The file takes about 2 minutes on 2 busy cores, vLLM's start most of it;
tests/e2e/test_tracing.py checks a gateway whose collector is down.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from testbed.engines import VllmEngine, ensure_vllm
from testbed.traces import Span, TraceBackend, ensure_trace_backend, trace_backend
from tests.e2e.conftest import headless_chromium
from tests.e2e.processes import (
    Gateway,
    Sim,
    chat,
    free_port,
    gateway,
    instance,
    simulator,
    start,
    stop,
    wait_until_serving,
)

pytestmark = pytest.mark.engine
LOAD = 0.5  # seconds a simulated load takes: each first request of a model waits that long
TRACE_WAIT = 30.0  # seconds for a trace's spans to reach the backend on a busy machine
VLLM_STARTUP = 240.0  # ~40 s alone, much more beside the rest of the suite
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "trace-swap.png"
CLIENT_SERVICE = "client-app"
SERVICE = "swapgate-backend-check"  # the backend check's own spans


@dataclass(frozen=True, slots=True)
class Call:
    """One traced call of the client: its span's ids (hex) and the headers that carry them."""

    trace_id: str
    span_id: str
    headers: dict[str, str]


class Client:
    """An application that traces with OpenTelemetry's SDK: its own span around each call,
    exported to the backend as it ends, and ``traceparent`` naming it on the request."""

    def __init__(self, backend: TraceBackend) -> None:
        resource = Resource.create({"service.name": CLIENT_SERVICE})
        self.provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=backend.traces_endpoint, headers=backend.headers)
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("test_traces")

    @contextmanager
    def call(self, name: str) -> Iterator[Call]:
        with self.tracer.start_as_current_span(name, kind=SpanKind.CLIENT) as span:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)  # the current span: this one
            context = span.get_span_context()
            yield Call(f"{context.trace_id:032x}", f"{context.span_id:016x}", headers)


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceBackend]:
    with trace_backend(ensure_trace_backend(), tmp_path_factory.mktemp("traces")) as running:
        yield running


@pytest.fixture(scope="module")
def client(backend: TraceBackend) -> Iterator[Client]:
    traced = Client(backend)
    try:
        yield traced
    finally:
        traced.provider.shutdown()


@contextmanager
def fleet(backend: TraceBackend) -> Iterator[tuple[Gateway, Sim]]:
    """A gateway tracing to ``backend`` in front of a simulated llama-swap whose models are
    cold: the first request of each waits for its load."""
    with simulator(models=("a", "b"), load_time=LOAD) as sim:
        config = {
            "routing": {"min_residency": 0},
            "instances": [instance("gpu-a", sim)],
            "tracing": {"endpoint": backend.url},
        }
        # MLflow takes spans only with its experiment's header: the standard variable
        with gateway(config, env=backend.exporter_env()) as gw:
            yield gw, sim


def one(spans: list[Span], name: str) -> Span:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{name!r} in {[span.name for span in spans]}"
    return found[0]


def children(spans: list[Span], parent: Span) -> list[str]:
    return sorted(span.name for span in spans if span.parent_id == parent.span_id)


def during(inner: Span, outer: Span) -> bool:
    return outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns


# -- the backend, as swapgate's spans will be read from it ------------------------------------


def hex_ids(span: OtelSpan) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_a_span_comes_back_with_its_parent_link_and_attributes(backend: TraceBackend) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    exporter = OTLPSpanExporter(endpoint=backend.traces_endpoint, headers=backend.headers)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test_traces")
    # The shape swapgate sends: a swap in a trace of its own, linked from a request that
    # waited for it; the request's server span with a child for its upstream call.
    with tracer.start_as_current_span("swap tiny") as swap:
        pass
    link = Link(swap.get_span_context(), {"swapgate.reason": "waited"})
    with tracer.start_as_current_span("chat tiny", kind=SpanKind.SERVER) as request:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.usage.input_tokens": 12,
            "swapgate.route": "swap",
            "swapgate.wait_ms": 1.5,
            "swapgate.cached": True,
        }
        with tracer.start_as_current_span(
            "upstream", kind=SpanKind.CLIENT, links=[link], attributes=attributes
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


# -- swapgate's traces ---------------------------------------------------------------------


def test_a_request_that_waited_for_a_swap_is_one_trace_under_the_clients_span(
    backend: TraceBackend, client: Client
) -> None:
    with fleet(backend) as (gw, sim), client.call("ask a") as call:
        answer = chat(gw.url, "a", headers=call.headers)
        assert answer.status_code == 200, answer.text
        assert sim.loads() == 1, "it waited for a's load"
    spans = backend.traces(call.trace_id, at_least=5, timeout=TRACE_WAIT)
    asked, request = one(spans, "ask a"), one(spans, "chat a")
    assert (asked.span_id, asked.parent_id) == (call.span_id, None)
    assert request.parent_id == call.span_id, "swapgate's span is a child of the client's"
    assert children(spans, request) == ["swap a", "swap wait a", "upstream instance/gpu-a"]
    wait, swap = one(spans, "swap wait a"), one(spans, "swap a")
    upstream = one(spans, "upstream instance/gpu-a")
    assert [(link.trace_id, link.span_id) for link in wait.links] == [
        (call.trace_id, swap.span_id)
    ], "the wait links the swap it waited for"
    assert all(during(span, request) for span in (wait, swap, upstream))
    assert wait.end_ns <= upstream.start_ns, "the engine was called once the wait was over"
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "a",
        "gen_ai.response.model": "a",
        "gen_ai.request.max_tokens": 3,
        "gen_ai.usage.input_tokens": 1,
        "gen_ai.usage.output_tokens": 3,
        "http.response.status_code": 200,
        "url.path": "/v1/chat/completions",
        "swapgate.route": "swap",
        "swapgate.instance": "gpu-a",
        "swapgate.stream": False,
        "swapgate.request_id": answer.headers["x-request-id"],
    }
    assert {key: request.attributes.get(key) for key in expected} == expected
    assert isinstance(request.attributes["swapgate.swap_id"], int)
    wait_ms = request.attributes["swapgate.wait_ms"]
    assert isinstance(wait_ms, int)
    assert LOAD * 1000 * 0.8 <= wait_ms < 10_000, "it waited as long as the load took"
    assert swap.attributes["swapgate.model"] == "a"
    assert swap.attributes["swapgate.instance"] == "gpu-a"
    assert swap.attributes["swapgate.kind"] == "load"
    assert swap.attributes["swapgate.result"] == "ok"
    assert upstream.attributes["swapgate.route"] == "instance/gpu-a"
    assert {span.status for span in spans} <= {"", "STATUS_CODE_UNSET", "STATUS_CODE_OK"}


def test_two_requests_that_shared_one_swap_both_link_the_same_swap_span(
    backend: TraceBackend, client: Client
) -> None:
    def ask(gw: Gateway) -> tuple[Call, int]:
        with client.call("ask a") as call:
            return call, chat(gw.url, "a", headers=call.headers).status_code

    with fleet(backend) as (gw, sim), ThreadPoolExecutor(2) as pool:
        done = [future.result() for future in [pool.submit(ask, gw), pool.submit(ask, gw)]]
        assert [status for _, status in done] == [200, 200]
        assert sim.loads() == 1, "both waited for the same load"
    # Read once the gateway stopped: it sent every span before it exited.
    traces = {call.trace_id: backend.traces(call.trace_id, 4, TRACE_WAIT) for call, _ in done}
    assert len(traces) == 2, "each request its own trace, the client's"
    # The swap is a child of the request whose wait started it: in that trace, not the other.
    swaps = [(trace_id, span) for trace_id, spans in traces.items() for span in spans]
    [(home, swap)] = [(trace_id, span) for trace_id, span in swaps if span.name == "swap a"]
    assert swap.parent_id == one(traces[home], "chat a").span_id
    for spans in traces.values():
        wait = one(spans, "swap wait a")
        assert [(link.trace_id, link.span_id) for link in wait.links] == [(home, swap.span_id)]
        assert one(spans, "chat a").attributes["swapgate.route"] == "swap"
        assert "upstream instance/gpu-a" in children(spans, one(spans, "chat a"))


def test_a_streamed_messages_request_and_a_responses_request_trace_as_chat_does(
    backend: TraceBackend, client: Client
) -> None:
    message = {
        "model": "a",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    response = {"model": "a", "input": "hi", "max_output_tokens": 5}
    with fleet(backend) as (gw, _):
        with client.call("ask a in Messages") as streamed:
            answer = httpx.post(
                f"{gw.url}/v1/messages", json=message, headers=streamed.headers, timeout=30
            )
            assert answer.status_code == 200, answer.text
            assert "event: message_stop" in answer.text, "the stream, whole"
        with client.call("ask a in Responses") as responded:  # a is warm by now
            answer = httpx.post(
                f"{gw.url}/v1/responses", json=response, headers=responded.headers, timeout=30
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "completed"

    spans = backend.traces(streamed.trace_id, at_least=5, timeout=TRACE_WAIT)
    request = one(spans, "chat a")  # Messages is a chat operation
    assert request.parent_id == streamed.span_id
    assert children(spans, request) == ["swap a", "swap wait a", "upstream instance/gpu-a"]
    assert request.attributes["url.path"] == "/v1/messages"
    assert request.attributes["swapgate.stream"] is True
    assert request.attributes["swapgate.route"] == "swap"
    assert request.attributes["gen_ai.usage.output_tokens"] == 5
    wait = one(spans, "swap wait a")
    assert [link.span_id for link in wait.links] == [one(spans, "swap a").span_id]

    spans = backend.traces(responded.trace_id, at_least=3, timeout=TRACE_WAIT)
    request = one(spans, "chat a")  # so is Responses
    assert request.parent_id == responded.span_id
    assert children(spans, request) == ["upstream instance/gpu-a"], "warm: no wait, no swap"
    assert request.attributes["url.path"] == "/v1/responses"
    assert request.attributes["swapgate.route"] == "warm"
    assert request.attributes["gen_ai.request.max_tokens"] == 5


@pytest.fixture(scope="module")
def vllm() -> VllmEngine:
    return ensure_vllm()


@contextmanager
def traced_vllm(engine: VllmEngine, backend: TraceBackend, root: Path) -> Iterator[str]:
    """A ``vllm serve`` of the tiny Llama as ``tiny`` that exports its spans to ``backend``;
    its URL. Its worker runs in its engine core (two processes, a shorter start)."""
    port = free_port()
    command = engine.serve("tiny", port)
    command += ["--otlp-traces-endpoint", backend.traces_endpoint]
    with engine.scratch() as scratch:
        env = {
            **engine.env(scratch),
            **backend.exporter_env(),
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # its default is gRPC
            "OTEL_SERVICE_NAME": "vllm",
        }
        log = root / "vllm.log"
        process = start(command, env, log=log)
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_until_serving(f"{url}/health", process, timeout=VLLM_STARTUP)
            except (RuntimeError, TimeoutError) as exc:  # with what vLLM said
                raise RuntimeError(f"{exc}: {log.read_text(errors='replace')[-3000:]}") from exc
            yield url
        finally:
            stop(process, timeout=20)


def test_vllm_hangs_its_own_span_under_swapgates_upstream_span(
    vllm: VllmEngine, backend: TraceBackend, client: Client, tmp_path: Path
) -> None:
    with traced_vllm(vllm, backend, tmp_path) as url:
        config = {
            "instances": [{"name": "cpu", "kind": "openai", "url": url, "models": ["tiny"]}],
            "tracing": {"endpoint": backend.url},
        }
        with gateway(config, env=backend.exporter_env()) as gw, client.call("ask tiny") as call:
            answer = chat(gw.url, "tiny", max_tokens=4, headers=call.headers, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
        spans = backend.traces(call.trace_id, at_least=4, timeout=TRACE_WAIT)
    request, upstream = one(spans, "chat tiny"), one(spans, "upstream instance/cpu")
    engine = one(spans, "llm_request")
    assert request.parent_id == call.span_id
    assert upstream.parent_id == request.span_id
    assert engine.parent_id == upstream.span_id, "vLLM's span is a child of swapgate's call"
    assert during(engine, upstream)
    assert engine.attributes["gen_ai.usage.completion_tokens"] == 4
    assert engine.attributes["gen_ai.request.max_tokens"] == 4
    # vLLM names its request after the X-Request-Id swapgate sent: the two spans tell of one
    request_id = request.attributes["swapgate.request_id"]
    assert str(engine.attributes["gen_ai.request.id"]).endswith(str(request_id))


# -- MLflow's own UI ---------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Debian's headless Chromium, in a window the size of the screenshot."""
    with headless_chromium("1400,760", "the trace UI test") as page:
        yield page


def until(page: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 30.0) -> Any:
    """``check(page)``'s first truthy answer; the page redraws meanwhile (stale elements)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = check(page)
        except (
            NoSuchElementException,
            StaleElementReferenceException,
            ElementClickInterceptedException,
        ):
            answer = None
        if answer:
            return answer
        if time.monotonic() > deadline:
            text = page.find_element(By.TAG_NAME, "body").text
            raise AssertionError(f"the page did not show it within {timeout}s:\n{text[-3000:]}")
        time.sleep(0.1)


def press(page: WebDriver, css: str, timeout: float = 10.0) -> bool:
    """Click the button ``css`` finds, from a script: MLflow's overlays (its assistant's panel,
    a tip) would take a pointer's click. False if none came within ``timeout``."""

    def pressed(p: WebDriver) -> bool:
        p.execute_script("arguments[0].click()", p.find_element(By.CSS_SELECTOR, css))
        return True

    try:
        return bool(until(page, pressed, timeout))
    except AssertionError:
        return False


def span_row(page: WebDriver, name: str) -> WebElement:
    """The span ``name``'s row in the trace's span tree."""
    return page.find_element(By.XPATH, f"//span[normalize-space(text())='{name}']")


def test_mlflows_ui_shows_the_swaps_trace(
    backend: TraceBackend, client: Client, browser: WebDriver, tmp_path: Path
) -> None:
    with fleet(backend) as (gw, _):
        assert chat(gw.url, "b").status_code == 200  # loaded first: a's swap evicts it
        with client.call("ask a") as call:  # 16 tokens at 50 a second: a bar of its own
            answer = chat(gw.url, "a", max_tokens=16, headers=call.headers)
            assert answer.status_code == 200
    backend.traces(call.trace_id, at_least=5, timeout=TRACE_WAIT)

    browser.get(backend.ui_url(call.trace_id))
    names = ("ask a", "chat a", "swap wait a", "swap a", "upstream instance/gpu-a")
    until(browser, lambda p: all(span_row(p, name).is_displayed() for name in names))
    # The assistant's side panel opens by itself, and a tip points at "Detect Issues": shut.
    press(browser, 'button[data-component-id="mlflow.assistant.chat_panel.close"]')
    press(browser, 'button[data-component-id="mlflow.detect_issues.guidance.got_it"]', 3)
    assert press(browser, 'button[data-component-id="mlflow.evaluations_review.modal.fullscreen"]')
    assert press(browser, 'button[aria-label="Show execution timeline"]')
    # The span tree's pane, wider: the timeline's bars and their names side by side.
    pane = browser.find_element(By.CSS_SELECTOR, "div.react-resizable")
    handle = pane.find_elements(By.XPATH, "./*")[-1]  # its drag handle, on its right edge
    ActionChains(browser).click_and_hold(handle).move_by_offset(560, 0).release().perform()
    ActionChains(browser).click(span_row(browser, "swap a")).perform()
    # its attributes, the model it evicted among them (a list, which MLflow writes as YAML)
    until(browser, lambda p: "swapgate.evicted\n- b" in p.find_element(By.TAG_NAME, "body").text)
    time.sleep(0.5)  # the pane's last redraw

    text = browser.find_element(By.TAG_NAME, "body").text
    for name in names:
        assert name in text, f"{name!r} on the page"
    shot = tmp_path / "trace-swap.png"
    assert browser.save_screenshot(str(shot))
    if os.environ.get("SWAPGATE_SCREENSHOT"):  # made once, committed (docs/operations.md)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
