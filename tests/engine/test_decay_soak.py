"""A short soak of a real engine (docs/operations.md, "Is the decay local?"): llama-cpp-python with
Gemma-3-270M under ``kind: process``, streamed requests at a steady pace for about 25 s.
The figures move with the real requests (TTFT against its baseline, requests per second, the
process group's memory slope) and the diagnosis of an engine that does not decay stays
``healthy``."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaCppEngine
from tests.e2e.processes import gateway, metric_in, wait_for
from tests.e2e.test_process import ENV, TOKEN
from tests.engine.conftest import process_node
from tests.engine.test_process_engine import engine_command

pytestmark = pytest.mark.engine
SOAK = 12.0  # seconds of load after the baseline
BODY = {
    "model": "gemma-a",
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 4,
    "stream": True,
}


def diagnosis(url: str) -> dict[str, Any]:
    state = httpx.get(f"{url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"}).json()
    model = state["instances"][0]["models"].get("gemma-a", {})
    return dict(model.get("diagnosis") or {"state": "not warm", "ttft_drift_ratio": None})


def test_a_real_engine_soaked_is_measured_and_stays_healthy(engine: LlamaCppEngine) -> None:
    config = process_node({"gemma-a": engine_command(engine, "gemma-a")})
    # A baseline of 6 s, a window of 15 s: short, for the test (the defaults are 1 h and
    # 10 min), yet holding the 5 answers a drift needs when a loaded machine slows each to 2 s.
    config["diagnosis"] = {"baseline": "6s", "window": "15s", "drift": 3.0}
    with gateway(config, ENV) as gw:
        url = f"{gw.url}/v1/chat/completions"
        stop, statuses = threading.Event(), []

        def load() -> None:  # one stream after another, a few a second: a flat load
            while not stop.is_set():
                with httpx.stream("POST", url, json=BODY, timeout=120) as answer:
                    statuses.append(answer.status_code)
                    for _ in answer.iter_lines():
                        pass
                time.sleep(0.2)

        loader = threading.Thread(target=load)
        loader.start()
        try:

            def measured() -> bool:
                figures = diagnosis(gw.url)
                drift, slope = figures["ttft_drift_ratio"], figures.get("rss_slope_bytes_per_hour")
                return drift is not None and slope is not None

            wait_for(measured, timeout=90)
            seen = []
            deadline = time.monotonic() + SOAK
            while time.monotonic() < deadline:
                seen.append(diagnosis(gw.url))
                time.sleep(3)
            metrics = gw.metrics()
        finally:
            stop.set()
            loader.join()
    last = seen[-1]
    print("soaked:", last)
    assert set(statuses) == {200}
    assert [d["state"] for d in seen] == ["healthy"] * len(seen), seen
    assert last["ttft_p95_ms"] > 0
    assert last["ttft_baseline_p95_ms"] > 0
    assert last["requests_per_second"] > 0.5
    assert metric_in(metrics, "swapgate_ttft_drift_ratio", model="gemma-a") > 0
    assert metric_in(metrics, "swapgate_engine_diagnosis", model="gemma-a", state="healthy") == 1
    assert 'swapgate_process_rss_slope_bytes_per_hour{instance="node",model="gemma-a"}' in metrics
