"""``max_concurrency`` in front of a real llama-cpp-python left at its default
``interrupt_requests`` (docs/keys.md): the engine cuts a running stream short, with a normal
``[DONE]``, as soon as another request reaches it. With ``max_concurrency: 1`` the others wait in
swapgate's queue instead, and every stream runs to its end."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaCppEngine
from tests.e2e.processes import gateway, metric_in
from tests.engine.conftest import llama_server, swap_on_request

pytestmark = pytest.mark.engine
TOKENS = 16
STREAMS = 8
# Gemma's end tokens (<eos>, <end_of_turn>) barred: a whole answer is TOKENS long.
BODY = {
    "model": "gemma-a",
    "messages": [{"role": "user", "content": "Count to twenty."}],
    "max_tokens": TOKENS,
    "stream": True,
    "logit_bias": {"1": -100, "106": -100},
}


def stream(url: str) -> tuple[str, str | None]:
    """One stream's text and its last finish_reason."""
    text, finish = "", None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY, timeout=180) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                text += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
    return text, finish


def run(url: str) -> tuple[list[tuple[str, str | None]], float]:
    """STREAMS streams at once; and the deepest queue swapgate reported meanwhile."""
    deepest, done = 0.0, threading.Event()

    def watch() -> None:
        nonlocal deepest
        while not done.wait(0.1):
            metrics = httpx.get(f"{url}/metrics", timeout=5).text
            deepest = max(deepest, metric_in(metrics, "swapgate_queue_depth", model="gemma-a"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
            answers = list(pool.map(lambda _: stream(url), range(STREAMS)))
    finally:
        done.set()
        watcher.join()
    return answers, deepest


def config(server: Any, **model: Any) -> dict[str, object]:
    return {
        "routing": {"poll_interval": "1s"},
        "instances": [swap_on_request("llama", server, ["gemma-a"])],
        "models": {"gemma-a": model},
    }


def test_max_concurrency_1_keeps_the_engine_from_cutting_streams(
    engine: LlamaCppEngine, tmp_path: Path
) -> None:
    with llama_server(engine, tmp_path, {"gemma-a": 2048}, interrupt=True) as server:
        with gateway(config(server)) as gw:  # today: every stream goes to the engine at once
            cut, _ = run(gw.url)
        with gateway(config(server, max_concurrency=1)) as gw:
            whole, deepest = run(gw.url)
    print(f"cut without max_concurrency: {sum(f != 'length' for _, f in cut)} of {STREAMS}")
    assert any(finish != "length" for _, finish in cut), (
        "the engine cut no stream without max_concurrency: this test shows nothing",
        cut,
    )
    assert [finish for _, finish in whole] == ["length"] * STREAMS, whole
    assert all(text.strip() for text, _ in whole)
    assert deepest >= 3, "the others waited in swapgate's queue (swapgate_queue_depth)"
