"""Swaps are expensive: queued requests for a swapped-in model are served together, and a
request for a cold model gets its swap even while every instance keeps serving warm traffic."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Gateway, gateway, instance, simulator

pytestmark = pytest.mark.e2e


def _chat(gw: Gateway, model: str, tokens: int = 2) -> httpx.Response:
    body = {"model": model, "messages": [], "max_tokens": tokens}
    return httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60)


def test_requests_queued_for_a_swap_are_served_before_the_next_swap() -> None:
    with simulator(models=("a", "b"), load_time=1.0) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw, concurrent.futures.ThreadPoolExecutor(8) as pool:
            first = [pool.submit(_chat, gw, "a") for _ in range(3)]
            time.sleep(0.2)  # a's swap is running; b's requests arrive while it loads
            second = [pool.submit(_chat, gw, "b") for _ in range(2)]
            answers = [f.result() for f in first + second]
        assert [a.status_code for a in answers] == [200] * 5
        assert sim.stats()["loads"] == {"a": 1, "b": 1}, "A A A B B: one swap each"


def test_a_cold_model_gets_its_swap_although_every_instance_stays_busy() -> None:
    with (
        simulator(models=("a", "b", "c"), load_time=0.5, token_rate=20) as one,
        simulator(models=("a", "b", "c"), load_time=0.5, token_rate=20) as two,
    ):
        config: dict[str, Any] = {
            "routing": {"poll_interval": "1h", "max_wait": "8s", "starvation_after": 0.25},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [instance("gpu-a", one), instance("gpu-b", two)],
        }
        with gateway(config) as gw:
            assert _chat(gw, "a").headers["x-swapgate-route"] == "instance/gpu-a"
            assert _chat(gw, "b").headers["x-swapgate-route"] == "instance/gpu-b"
            stop = threading.Event()
            warm_answers: list[int] = []

            def keep_busy(model: str) -> None:  # one second per request, two at a time
                while not stop.is_set():
                    warm_answers.append(_chat(gw, model, tokens=20).status_code)

            workers = [threading.Thread(target=keep_busy, args=(m,)) for m in "aabb"]
            for worker in workers:
                worker.start()
            try:
                time.sleep(1.0)
                started = time.monotonic()
                cold = _chat(gw, "c")
                waited = time.monotonic() - started
            finally:
                stop.set()
                for worker in workers:
                    worker.join(timeout=30)
        assert cold.status_code == 200, cold.text
        assert waited < 8 * 0.75, f"answered in {waited:.1f}s, well inside max_wait"
        assert all(not w.is_alive() for w in workers)
        assert set(warm_answers) <= {200, 503}, "every warm request got an answer"
        assert warm_answers.count(200) >= len(warm_answers) - 4
