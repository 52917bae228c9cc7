"""``x-swapgate-wait-ms`` is the wait before the headers. On an answer that keep-alives
committed early that is not the whole wait, so the whole wait goes where it can still be read:
a stream's last SSE comment, the access log line and the wait metrics."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.processes import gateway, instance, simulator
from tests.e2e.wire import post

pytestmark = pytest.mark.e2e
LOAD = 2.0


def test_a_committed_stream_tells_its_whole_wait_at_its_end(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    with simulator(load_time=LOAD) as sim:
        config = {
            "server": {"log_level": "info"},
            "keepalive": {"early_headers_after": "300ms", "interval": "300ms"},
            "instances": [instance("sim", sim)],
        }
        with gateway(config, log=log) as gw:
            body = {
                "model": "a",
                "stream": True,
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "hi"}],
            }
            answer = post(gw.url, "/v1/chat/completions", body)
            waited = gw.metric("swapgate_wait_seconds_sum", model="a")
    lines = [line for line in answer.lines() if line]
    header = int(answer.headers["x-swapgate-wait-ms"])
    assert header < 1000  # the wait until the early 200: the header can say no more
    told = re.fullmatch(r": swapgate waited (\d+) ms", lines[-1])
    assert told is not None, lines[-3:]
    assert lines[-2] == "data: [DONE]"  # the engine's stream, whole, before it
    whole = int(told[1])
    assert whole >= LOAD * 1000 * 0.9
    assert abs(waited * 1000 - whole) < 50  # the metric says the same
    logged = re.search(r'"POST /v1/chat/completions" 200 .* wait_ms=(\d+)', log.read_text())
    assert logged is not None
    assert int(logged[1]) == whole
