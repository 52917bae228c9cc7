"""Each driver against a simulator of its flavour, through the gateway."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.processes import chat, gateway, instance, simulator

pytestmark = pytest.mark.e2e
MESSAGES = [{"role": "user", "content": "hello"}]


def test_ollama_models_are_discovered_loaded_and_renamed() -> None:
    with simulator("ollama", models=("qwen2.5-coder:32b", "llama3:8b"), load_time=0.5) as sim:
        config = {
            "instances": [instance("gpu-o", sim, kind="ollama")],
            "models": {"qwen-coder": {"upstream_names": {"gpu-o": "qwen2.5-coder:32b"}}},
            "routing": {"poll_interval": "1h", "min_residency": 0},
        }
        with gateway(config) as gw:
            listed = {m["id"] for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
            assert listed == {"qwen-coder", "llama3:8b"}
            response = chat(gw.url, "qwen-coder")
            assert response.status_code == 200
            assert response.json()["model"] == "qwen2.5-coder:32b"  # the upstream's own answer
            assert sim.stats()["loads"] == {"qwen2.5-coder:32b": 1}
            assert chat(gw.url, "llama3:8b").status_code == 200
            stats = sim.stats()
            assert stats["loads"] == {"qwen2.5-coder:32b": 1, "llama3:8b": 1}
            assert stats["resident"] == {"llama3:8b": "ready"}


def test_openai_servers_are_warm_without_swaps() -> None:
    with simulator("openai", models=("big",)) as sim:
        config = {"instances": [instance("vllm", sim, kind="openai")]}
        with gateway(config) as gw:
            response = chat(gw.url, "big")
            assert response.status_code == 200
            assert response.headers["x-swapgate-wait-ms"] == "0"
            assert sim.stats()["loads"] == {}


def test_swap_on_request_servers_are_warmed_with_one_token() -> None:
    with simulator("openai", models=("x", "y"), load_time=0.3) as sim:
        config = {
            "instances": [instance("cpp", sim, kind="swap-on-request")],
            "routing": {"poll_interval": "1h", "min_residency": 0},
        }
        with gateway(config) as gw:
            assert chat(gw.url, "x").status_code == 200
            assert chat(gw.url, "y").status_code == 200
            second = chat(gw.url, "y")
            assert second.headers["x-swapgate-wait-ms"] == "0"
            metrics = httpx.get(f"{gw.url}/metrics").text
            assert 'swapgate_swaps_total{instance="cpp",model="x",result="ok"} 1.0' in metrics
            assert 'swapgate_swaps_total{instance="cpp",model="y",result="ok"} 1.0' in metrics
            assert 'swapgate_model_warm{instance="cpp",model="x"} 0.0' in metrics
