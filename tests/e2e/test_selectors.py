"""Selectors (docs/configuration.md): a model name that answers from the first of its targets
that is warm, so that a client that takes any of several models pays for no swap; with none
warm, the first target is loaded once for all its waiters. One simulated llama-swap instance
(capacity 1) serving two models."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.e2e.processes import chat, gateway, instance, simulator

pytestmark = pytest.mark.e2e


def test_a_selector_answers_from_the_warm_target_and_loads_the_first_once_when_none_is() -> None:
    with simulator(models=("big", "small"), load_time=1.0) as sim:
        config = {
            "routing": {"min_residency": 0},
            "instances": [instance("gpu", sim, capacity=1)],
            "models": {"coder": {"choose": {"from": ["big", "small"], "strategy": "warm"}}},
        }
        with gateway(config) as gw:
            listed = {m["id"]: m for m in httpx.get(f"{gw.url}/v1/models").json()["data"]}
            assert listed["coder"]["swapgate"]["choose"] == {
                "from": ["big", "small"],
                "strategy": "warm",
            }
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                cold = list(pool.map(lambda _: chat(gw.url, "coder"), range(4)))
            assert [r.status_code for r in cold] == [200] * 4
            assert {r.headers["x-swapgate-model"] for r in cold} == {"big"}, "none warm: the first"
            assert sim.stats()["loads"] == {"big": 1}, "one load for all four"
            assert chat(gw.url, "small").status_code == 200  # small now warm, big evicted
            warm = chat(gw.url, "coder")
            assert warm.headers["x-swapgate-model"] == "small", "the warm one"
            assert sim.stats()["loads"] == {"big": 1, "small": 1}, "no swap for the selector"
            direct = chat(gw.url, "big")
            assert "x-swapgate-model" not in direct.headers, "only a selector says"


def test_v1_models_says_loading_during_a_swap_and_loaded_once_warm() -> None:
    """Each entry's ``status`` as llama.cpp's router writes it, which Open WebUI reads."""
    with simulator(models=("big", "small"), load_time=1.5) as sim:
        config = {"routing": {"min_residency": 0}, "instances": [instance("gpu", sim, capacity=1)]}
        with gateway(config) as gw:

            def statuses() -> dict[str, str]:
                data = httpx.get(f"{gw.url}/v1/models").json()["data"]
                return {m["id"]: m["status"]["value"] for m in data}

            assert statuses() == {"big": "unloaded", "small": "unloaded"}
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                answer = pool.submit(chat, gw.url, "big")
                seen = set()
                while not answer.done():
                    seen.add(statuses()["big"])
                assert answer.result().status_code == 200
            assert "loading" in seen, seen
            assert statuses() == {"big": "loaded", "small": "unloaded"}
