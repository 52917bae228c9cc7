"""A real trace backend for the tests of swapgate's traces (SPEC §33): MLflow's tracking server,
installed once per machine and started by the test on loopback.

Which backend, and why this one: Jaeger, Grafana Tempo and the OpenTelemetry Collector ship
no package on PyPI, npm or Debian (the only registries these machines reach), and Arize Phoenix
(PyPI) takes OTLP/HTTP but drops every span's links, its kind and its resource on the way in: a
swap span linked from the requests that waited for it could not be read back. MLflow's server
(PyPI, ``mlflow``) takes OTLP/HTTP at ``/v1/traces``, keeps parents, typed attributes and links
(with their attributes), answers a trace through its own REST API and shows it in its own UI.

What MLflow 3.17 keeps less of than Jaeger would, and the tests must not ask of it:

- no span kind (SERVER, CLIENT): ``Span.kind`` is None (3.18 stores it; read where present);
- no service per span: the resource of a trace's spans becomes tags of the whole trace, the
  last batch's winning (in practice the root's, which ends last): ``Span.service`` is that;
- it takes a span only with the header ``x-mlflow-experiment-id``: an exporter started by the
  test gets ``TraceBackend.headers``, a process that exports by itself (swapgate, vLLM) gets
  ``TraceBackend.exporter_env()``, the standard variable the OpenTelemetry SDK reads.

The server lies in a virtual environment of its own in the engine cache (testbed/engines.py's
``cache_root()``; about 2 minutes and 0.9 GB, mostly MLflow's pandas, pyarrow, scipy and
scikit-learn), never in ``.venv``. Each ``trace_backend()`` starts a fresh one: its SQLite store
in a temporary folder, one port for OTLP/HTTP, the query API and the UI (it has no gRPC
receiver), stopped with all its processes on exit.

``python -m testbed.traces`` installs it and prints where.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import urlopen

from swapgate.drivers.children import die_with_parent, exit_name, free_port
from testbed.cache import cache_root, once, run

# 3.17.2: the newest whose whole set installs here (mlflow 3.18.0 needs an mlflow-tracing
# 3.18.0 the index does not have yet).
MLFLOW_VERSION = "3.17.2"
# Every new store has this experiment (MLflow's "Default"): spans sent with its id land there.
EXPERIMENT = "0"
EXPERIMENT_HEADER = "x-mlflow-experiment-id"
STARTUP = 180.0  # ~25 s on 2 busy cores: migrations of a new SQLite store, then uvicorn
STOP_GRACE = 5.0  # its store is thrown away: no clean shutdown is worth waiting longer for
# What the server runs with, and nothing else of ours: an OTEL_* variable meant for swapgate
# would make MLflow's own tracing export to it; the rest keeps it offline and small.
SERVER_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    # No job runner: it starts seven huey consumers (1.6 GB) that a trace never uses.
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
}
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "TMPDIR")


class TraceBackendBroken(RuntimeError):
    """The trace backend did not start or did not answer; the message has its last lines."""


@dataclass(frozen=True, slots=True)
class Link:
    """A link from a span to another span (of any trace), with its attributes."""

    trace_id: str
    span_id: str
    attributes: dict[str, object]


@dataclass(frozen=True, slots=True)
class Span:
    """One span as the backend gives it back: ids in lowercase hex, as ``traceparent`` has
    them; ``attributes`` without MLflow's own (``mlflow.*``); times in Unix nanoseconds."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str | None  # "SPAN_KIND_SERVER"…; None where the backend did not keep it (3.17)
    attributes: dict[str, object]
    links: tuple[Link, ...]
    service: str | None  # the trace's service.name (MLflow keeps one a trace, not a span)
    start_ns: int
    end_ns: int
    status: str  # "STATUS_CODE_OK", "STATUS_CODE_ERROR" or "" (unset)


@dataclass(frozen=True, slots=True)
class TraceBackend:
    """A running MLflow server: ``url`` is its OTLP/HTTP base, query API and UI at once."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def traces_endpoint(self) -> str:
        """Where an exporter sends spans (``OTLPSpanExporter(endpoint=...)``); swapgate's
        ``tracing.endpoint`` and vLLM's ``--otlp-traces-endpoint`` take it too."""
        return f"{self.url}/v1/traces"

    @property
    def headers(self) -> dict[str, str]:
        """The headers an exporter must send for MLflow to take its spans."""
        return {EXPERIMENT_HEADER: EXPERIMENT}

    def exporter_env(self) -> dict[str, str]:
        """The environment a process that exports by itself needs beside its endpoint: the
        OpenTelemetry SDK's OTLP exporter reads its headers from it."""
        return {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"{EXPERIMENT_HEADER}={EXPERIMENT}"}

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def traces(self, trace_id: str, at_least: int = 1, timeout: float = 30.0) -> list[Span]:
        """The spans of the trace ``trace_id`` (32 hex digits), in start order, once the backend
        has ``at_least`` of them: a batching exporter sends them a while after they end."""
        deadline = time.monotonic() + timeout
        spans: list[Span] = []
        while True:
            spans = self._spans(trace_id)
            if len(spans) >= at_least:
                return spans
            if time.monotonic() > deadline:
                names = [span.name for span in spans]
                raise TimeoutError(
                    f"trace {trace_id} has {len(spans)} spans {names} after {timeout:g}s, "
                    f"not {at_least}"
                )
            time.sleep(0.2)

    def _spans(self, trace_id: str) -> list[Span]:
        # MLflow names an OTLP trace "tr-" + its OpenTelemetry id. A trace it has not seen is a
        # 404; one whose root has not come yet answers with the spans it has (IN_PROGRESS).
        query = f"trace_id=tr-{quote(trace_id)}&allow_partial=true"
        try:
            with urlopen(f"{self.url}/api/3.0/mlflow/traces/get?{query}", timeout=10) as answer:
                body = json.load(answer)
        except HTTPError as error:
            if error.code == 404:
                return []
            raise
        trace = body["trace"]
        service = trace["trace_info"].get("tags", {}).get("service.name")
        spans = [_span(raw, service) for raw in trace.get("spans", [])]
        return sorted(spans, key=lambda span: (span.start_ns, span.span_id))

    def ui_url(self, trace_id: str) -> str:
        """The trace's page in MLflow's own UI (a hash route: a browser renders it, a plain
        GET gets the app's page)."""
        return f"{self.url}/#/experiments/{EXPERIMENT}/traces/tr-{trace_id}"


def _hex(encoded: str) -> str:
    """An id as protobuf's JSON writes bytes (base64), in the hex ``traceparent`` uses."""
    return base64.b64decode(encoded).hex()


def _value(any_value: Mapping[str, object]) -> object:
    """An OTLP ``AnyValue`` in protobuf's JSON as the Python value it stands for."""
    for key, raw in any_value.items():
        if key in ("string_value", "bool_value"):
            return raw
        if key == "int_value":  # int64: protobuf's JSON may write it as a string
            return int(str(raw))
        if key == "double_value":
            return float(str(raw))
        if key == "bytes_value":
            return base64.b64decode(str(raw))
        if key == "array_value" and isinstance(raw, dict):
            return [_value(item) for item in raw.get("values", [])]
        if key == "kvlist_value" and isinstance(raw, dict):
            return _attributes(raw.get("values", []))
    return None  # an empty AnyValue


def _attributes(pairs: list[dict[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for pair in pairs:
        value = pair.get("value")
        found[str(pair["key"])] = _value(value) if isinstance(value, dict) else None
    return found


def _span(raw: dict[str, object], service: str | None) -> Span:
    attributes = _attributes(_list(raw.get("attributes")))
    links = tuple(
        Link(
            _hex(str(link["trace_id"])),
            _hex(str(link["span_id"])),
            _attributes(_list(link.get("attributes"))),
        )
        for link in _list(raw.get("links"))
    )
    status = raw.get("status")
    parent = raw.get("parent_span_id")
    return Span(
        name=str(raw["name"]),
        trace_id=_hex(str(raw["trace_id"])),
        span_id=_hex(str(raw["span_id"])),
        parent_id=_hex(parent) if isinstance(parent, str) and parent else None,
        kind=str(raw["kind"]) if raw.get("kind") else None,
        # MLflow's own bookkeeping (mlflow.traceRequestId…), never what the sender set
        attributes={k: v for k, v in attributes.items() if not k.startswith("mlflow.")},
        links=links,
        service=service,
        start_ns=int(str(raw.get("start_time_unix_nano", 0))),
        end_ns=int(str(raw.get("end_time_unix_nano", 0))),
        status=str(status.get("code", "")) if isinstance(status, dict) else "",
    )


def _list(raw: object) -> list[dict[str, object]]:
    return [item for item in raw if isinstance(item, dict)] if isinstance(raw, list) else []


def ensure_trace_backend(say: bool = True) -> Path:
    """The cached MLflow server's ``mlflow`` command, installed first if this machine has none
    (one process installs, the others wait for it)."""
    root = cache_root() / f"trace-backend-mlflow-{MLFLOW_VERSION}"
    what = f"MLflow {MLFLOW_VERSION} (trace backend)"
    once(root, what, say, lambda: _install(root), "~2 min, 0.9 GB")
    return root / "bin" / "mlflow"


def _install(root: Path) -> None:
    run([sys.executable, "-m", "venv", "--clear", str(root)])
    python = str(root / "bin" / "python")
    run([python, "-m", "pip", "install", "--quiet", f"mlflow=={MLFLOW_VERSION}"])


@contextmanager
def trace_backend(mlflow: Path, root: Path | None = None) -> Iterator[TraceBackend]:
    """A fresh MLflow server on a free loopback port, its store in ``root`` (a temporary folder
    by default), ready to take spans; stopped with all its processes on exit."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trace-backend-")))
        root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = root / f"mlflow-{port}.log"
        command = [
            str(mlflow),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--default-artifact-root",
            str(root / "artifacts"),
        ]
        env = {name: os.environ[name] for name in KEEP_ENV if name in os.environ}
        # HOME in the temporary folder too: nothing it writes outlives the test.
        env |= {**SERVER_ENV, "HOME": str(root)}
        with log.open("wb") as output:
            process = subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
                start_new_session=True,  # `mlflow server` runs uvicorn as a child: one group
            )
        backend = TraceBackend(f"http://127.0.0.1:{port}", process, log)
        try:
            _wait_ready(backend)
            yield backend
        finally:
            _stop_group(process)


def _wait_ready(backend: TraceBackend, timeout: float = STARTUP) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if backend.process.poll() is not None:
            how = exit_name(backend.process.returncode)
            raise TraceBackendBroken(f"MLflow exited with {how} while starting:\n{_tail(backend)}")
        with (
            contextlib.suppress(URLError, OSError, ValueError),
            urlopen(f"{backend.url}/health", timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        if time.monotonic() > deadline:
            raise TraceBackendBroken(f"MLflow did not answer in {timeout:g}s:\n{_tail(backend)}")
        time.sleep(0.3)


def _tail(backend: TraceBackend, lines: int = 15) -> str:
    said = backend.said().splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in said) or "    (no output)"


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its whole group, SIGKILL to what is left ``STOP_GRACE`` seconds later."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_GRACE)
    # The group outlives its leader when uvicorn is slower to go: nothing of it stays behind.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


if __name__ == "__main__":
    print(ensure_trace_backend().parent.parent)
