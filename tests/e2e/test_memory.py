"""Placement by memory (docs/memory.md) against a simulator: 10, 10 and 20 GiB models on 24 GiB."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e


def test_two_small_models_share_the_card_and_the_big_one_evicts_both_once_idle() -> None:
    with simulator(models=("a", "b", "c"), load_time=0.5, capacity=3, token_rate=50) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "instances": [instance("card", sim, memory="24GiB", capacity=3)],
            "models": {
                "a": {"memory": "10GiB"},
                "b": {"memory": "10GiB"},
                "c": {"memory": "20GiB"},
            },
        }
        with gateway(config) as gw, httpx.Client(base_url=gw.url, timeout=30) as client:

            def chat(model: str, **extra: object) -> httpx.Response:
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}
                return client.post("/v1/chat/completions", json=body)

            assert chat("a").status_code == 200
            assert chat("b").status_code == 200
            assert sim.stats()["resident"] == {"a": "ready", "b": "ready"}, "both fit: 20 of 24"
            assert sim.stats()["unloads"] == 0

            def stream_a() -> list[str]:
                body = {
                    "model": "a",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                    "max_tokens": 100,
                }
                with httpx.stream(
                    "POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30
                ) as response:
                    return [line for line in response.iter_lines() if line.startswith("data:")]

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                streaming = pool.submit(stream_a)  # 2 s of tokens
                wait_for(lambda: sim.stats()["active"] == 1)
                big = pool.submit(chat, "c")
                time.sleep(1.0)
                assert not big.done(), "c waits: a has a request in flight"
                assert set(sim.stats()["resident"]) == {"a", "b"}
                events = streaming.result()
                answer = big.result()
            assert events[-1] == "data: [DONE]"
            assert not any('"error"' in e for e in events)
            assert answer.status_code == 200
            assert "Hello from c" in json.dumps(answer.json())
            stats = sim.stats()
            assert stats["resident"] == {"c": "ready"}
            assert (stats["unloads"], stats["loads"]) == (2, {"a": 1, "b": 1, "c": 1})
            pattern = r'swapgate_swaps_total\{instance="card",model="c",result="ok"\} (\S+)'
            swaps = re.findall(pattern, gw.metrics())
            assert swaps == ["1.0"], "one swap evicted both"
