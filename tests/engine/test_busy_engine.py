"""A busy engine is not a dead one: llama-cpp-python answers no ``GET /v1/models`` while it
generates (measured here: 7.7 s during a 300-token answer), so a 5 s poll would time out; and
with its default ``interrupt_requests`` that poll cuts the running answer short. swapgate does
not poll a ``swap-on-request`` instance while requests are in flight there
(docs/architecture.md): the instance stays up, its model stays warm, and other requests for it
are served, not answered 503 and reloaded. (A poll that times out while answers move on other
kinds counts as ``poll_busy``.)
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from testbed.engines import LlamaCppEngine
from tests.e2e.processes import gateway
from tests.e2e.test_process import ENV, TOKEN
from tests.engine.conftest import llama_server, swap_on_request

pytestmark = pytest.mark.engine
# Gemma's end tokens (<eos>, <end_of_turn>) barred: the answer runs its whole length, ~5 s here:
# ten poll intervals, any one of which would cut it short.
LONG = {
    "messages": [{"role": "user", "content": "Tell a long story."}],
    "max_tokens": 150,
    "stream": True,
    "logit_bias": {"1": -100, "106": -100},
}


def test_a_real_engine_that_streams_is_not_polled_and_stays_up(
    gemma: LlamaCppEngine, tmp_path: Path
) -> None:
    engine = gemma  # Gemma itself: the tiny Llama ends 150 tokens in half a second
    # interrupt_requests at the engine's default: whatever else reaches it cuts the stream
    with llama_server(engine, tmp_path, {"gemma-a": 2048}, interrupt=True) as server:
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "500ms"},
            "instances": [swap_on_request("llama", server, ["gemma-a"])],
            "models": {"gemma-a": {"max_concurrency": 1}},  # the client's second request waits
        }
        with gateway(config, ENV) as gw, gw.admin(TOKEN) as admin:
            url = f"{gw.url}/v1/chat/completions"
            warm = httpx.post(url, json={"model": "gemma-a", **_hello()}, timeout=60)
            assert warm.status_code == 200, warm.text
            events: list[dict[str, object]] = []
            streaming = threading.Thread(target=_stream, args=(url, events))
            streaming.start()
            ups, second = [], None
            started = time.monotonic()
            while streaming.is_alive():
                instance = admin.get("/admin/state").json()["instances"][0]
                ups.append(instance["up"])
                if second is None and time.monotonic() - started > 1.5:
                    second = httpx.post(url, json={"model": "gemma-a", **_hello()}, timeout=60)
                time.sleep(0.25)
            streaming.join()
            took = time.monotonic() - started
            failed = gw.metric("swapgate_upstream_errors_total", instance="llama")
            swaps = gw.metric("swapgate_swaps_total", instance="llama")
    assert took > 2, "it streamed for several poll intervals"
    assert all(ups), f"the instance went down while it streamed ({ups.count(False)} samples)"
    assert events[-1]["choices"][0]["finish_reason"] == "length", "no poll cut it"  # type: ignore[index]
    assert failed == 0
    assert second is not None
    assert second.status_code == 200, second.text
    assert swaps == 1  # the first load only: nothing was reloaded


def _hello() -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def _stream(url: str, events: list[dict[str, object]]) -> None:
    with httpx.stream("POST", url, json={"model": "gemma-a", **LONG}, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
