"""Tracing with the collector gone (docs/operations.md, "Tracing"): a gateway whose
``tracing.endpoint`` answers nothing serves every request as it would without tracing, the same
status and the same body, and says what it lost instead: ``swapgate_trace_spans_dropped_total``
counts the spans it could not send, and its log warns once. tests/engine/test_traces.py reads
the spans of a gateway whose collector is up, from a real trace backend.

The OpenTelemetry exporter retries a refused batch until its timeout (10 s by default) before
it gives it up; the gateway here runs with the standard ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT``
at 3 s, so each batch is counted dropped about 5 s after its spans ended (2 s in the queue).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.processes import chat, free_port, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
DROPPED = "swapgate_trace_spans_dropped_total"
ENV = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3"}  # seconds; the exporter reads it itself


def test_a_dead_collector_changes_no_answer_and_its_spans_are_counted_dropped(
    tmp_path: Path,
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there: each export is refused
    log = tmp_path / "gateway.log"
    with simulator(models=("a", "b"), load_time=0.5) as sim:
        config = {
            "routing": {"min_residency": 0},
            "instances": [instance("gpu-a", sim)],
            "tracing": {"endpoint": closed},
        }
        with gateway(config, env=ENV, log=log) as gw:
            assert gw.metric(DROPPED) == 0
            parent = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
            answer = chat(gw.url, "a", headers={"traceparent": parent})  # waits for a's load
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["model"] == "a"
            assert body["choices"][0]["message"]["content"] == "Hello from a"
            assert body["usage"]["completion_tokens"] == 3
            assert sim.loads() == 1, "it waited for a swap"
            # The batch of its 4 spans (request, swap wait, swap, upstream), refused and counted.
            wait_for(lambda: gw.metric(DROPPED) >= 4, timeout=15, interval=0.2)
            again = chat(gw.url, "a", headers={"traceparent": parent})
            assert again.status_code == 200
            assert again.json()["choices"][0]["message"]["content"] == "Hello from a"
            wait_for(lambda: gw.metric(DROPPED) >= 6, timeout=15, interval=0.2)
    lines = log.read_text().splitlines()
    warnings = [line for line in lines if "trace spans dropped" in line]
    assert len(warnings) == 1, warnings  # one a minute, however many batches failed
    assert "(the collector did not take them)" not in warnings[0], "it says why"
    # The exporter's own lines (each retry, each batch it gives up on) are the warning's reason
    exporter = [line for line in lines if "export" in line.lower() and line not in warnings]
    assert exporter == []
