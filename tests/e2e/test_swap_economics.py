"""Swaps are expensive: queued requests for a swapped-in model are served together, and a
request for a cold model gets its swap even while every instance keeps serving warm traffic."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time
from typing import Any

import pytest

from tests.e2e.processes import chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e


def test_requests_queued_for_a_swap_are_served_before_the_next_swap() -> None:
    with simulator(models=("a", "b"), load_time=1.0) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw, concurrent.futures.ThreadPoolExecutor(4) as pool:
            # a's first requester starts the swap and leaves; b queues behind the swap; then
            # another request for a joins it. When a is warm, b's request wakes first.
            starter = socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])))
            payload = b'{"model": "a", "messages": []}'
            starter.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\ncontent-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            swapping = 'swapgate_swaps_in_progress{instance="gpu-a"} 1.0'
            wait_for(lambda: swapping in gw.metrics())
            b = pool.submit(chat, gw.url, "b", 2, 60)
            wait_for(lambda: 'swapgate_queue_depth{model="b"} 1.0' in gw.metrics())
            starter.close()
            wait_for(lambda: 'swapgate_queue_depth{model="a"} 1.0' not in gw.metrics())
            a = pool.submit(chat, gw.url, "a", 2, 60)
            assert a.result().status_code == 200
            assert b.result().status_code == 200
        assert sim.stats()["loads"] == {"a": 1, "b": 1}, "a served its waiter before b's swap"


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
            assert (
                chat(gw.url, "a", max_tokens=2, timeout=60).headers["x-swapgate-route"]
                == "instance/gpu-a"
            )
            assert (
                chat(gw.url, "b", max_tokens=2, timeout=60).headers["x-swapgate-route"]
                == "instance/gpu-b"
            )
            stop = threading.Event()
            warm_answers: list[int] = []

            def keep_busy(model: str) -> None:  # one second per request, two at a time
                while not stop.is_set():
                    warm_answers.append(chat(gw.url, model, max_tokens=20, timeout=60).status_code)

            workers = [threading.Thread(target=keep_busy, args=(m,)) for m in "aabb"]
            for worker in workers:
                worker.start()
            try:
                time.sleep(1.0)
                started = time.monotonic()
                cold = chat(gw.url, "c", max_tokens=2, timeout=60)
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


@pytest.mark.parametrize(("eviction", "kept", "evicted"), [("lru", "b", "a"), ("demand", "a", "b")])
def test_demand_keeps_the_steady_model_and_evicts_the_burst_that_is_over(
    eviction: str, kept: str, evicted: str
) -> None:
    """One instance with room for two models: a is requested steadily, every 0.8 s; b comes in
    bursts, a couple of seconds apart. The second burst ends just after a's latest request, then
    c needs room. ``lru`` evicts a, the least recently used, which is about to be asked for
    again; ``demand`` learned both models' gaps and evicts b, whose burst is over."""
    with simulator(models=("a", "b", "c"), load_time=0.2, capacity=2) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0, "eviction": eviction},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [instance("gpu-a", sim, capacity=2)],
        }
        with gateway(config) as gw:

            def burst() -> None:
                for _ in range(4):
                    assert chat(gw.url, "b", max_tokens=1, timeout=60).status_code == 200

            burst()
            for _ in range(4):  # 2.4 s of steady traffic on a, nothing on b
                assert chat(gw.url, "a", max_tokens=1, timeout=60).status_code == 200
                time.sleep(0.8)
            assert chat(gw.url, "a", max_tokens=1, timeout=60).status_code == 200
            burst()
            time.sleep(0.4)  # b: idle longer than between its requests within a burst
            assert chat(gw.url, "c", max_tokens=1, timeout=60).status_code == 200
        assert set(sim.stats()["resident"]) == {kept, "c"}, f"{eviction} evicts {evicted}"
