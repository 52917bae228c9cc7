"""Workload pools and wait budgets (docs/operations.md): one model, two pool shapes, one
endpoint."""

from __future__ import annotations

import concurrent.futures
import statistics
import time

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
SHORT = "hello " * 20
LONG = "word " * 24_000  # 120,000 characters: about 30,000 tokens


def ask(url: str, text: str, **headers: str) -> tuple[httpx.Response, float]:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    started = time.monotonic()
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    return answer, time.monotonic() - started


def pools_config(chat: object, batch: object) -> dict[str, object]:
    return {
        "routing": {"poll_interval": "200ms", "min_residency": 0},
        "keepalive": {"non_streaming": "off"},
        "instances": [instance("chat", chat), instance("batch", batch)],  # type: ignore[arg-type]
        "models": {
            "m": {
                "pools": [
                    {"name": "interactive", "instances": ["chat"], "max_prompt_tokens": 4096},
                    {"name": "batch", "instances": ["batch"]},
                ]
            }
        },
    }


def test_prompts_go_to_their_pool_and_a_batch_swap_does_not_slow_interactive_requests() -> None:
    with (
        simulator(models=("m", "x"), load_time=0.2) as chat,
        simulator(models=("m", "x"), load_time=3.0) as batch,
        gateway(pools_config(chat, batch)) as gw,
    ):
        short, _ = ask(gw.url, SHORT)
        assert (short.headers["x-swapgate-pool"], short.headers["x-swapgate-route"]) == (
            "interactive",
            "instance/chat",
        )
        baseline = [ask(gw.url, SHORT)[1] for _ in range(10)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            long = pool.submit(ask, gw.url, LONG)  # the batch pool swaps m in: 3 s
            time.sleep(0.2)
            during = [ask(gw.url, SHORT)[1] for _ in range(10)]
            long_answer, long_took = long.result()
        assert long_answer.status_code == 200
        assert long_answer.headers["x-swapgate-pool"] == "batch"
        assert long_answer.headers["x-swapgate-route"] == "instance/batch"
        assert long_took > 2.5, "it waited for the batch pool's swap"
        p95 = statistics.quantiles(during, n=20)[18]
        assert p95 < max(statistics.quantiles(baseline, n=20)[18] * 3, 0.5), (baseline, during)
        assert chat.stats()["loads"] == {"m": 1}
        assert (
            'swapgate_pool_requests_total{model="m",pool="batch",status="200"} 1.0' in gw.metrics()
        )


def test_a_pool_that_is_down_falls_through_only_to_a_pool_the_prompt_fits() -> None:
    with (
        simulator(models=("m",), load_time=0.2) as chat,
        simulator(models=("m",), load_time=0.2) as batch,
        gateway(pools_config(chat, batch)) as gw,
    ):
        chat.kill()
        wait_for(lambda: 'swapgate_instance_up{instance="chat"} 0.0' in gw.metrics())
        short, _ = ask(gw.url, SHORT)
        assert short.status_code == 200
        assert short.headers["x-swapgate-pool"] == "batch", "the next pool it fits"
        batch.kill()
        wait_for(lambda: 'swapgate_instance_up{instance="batch"} 0.0' in gw.metrics())
        long, _ = ask(gw.url, LONG)
        assert long.status_code == 503
        assert long.headers["x-swapgate-pool"] == "batch", "never the pool whose limit it exceeds"
        assert "batch is down" in long.json()["error"]["message"]
    with simulator(models=("m",), load_time=0.2) as only:
        config = pools_config(only, only)
        config["models"] = {
            "m": {
                "pools": [
                    {"name": "interactive", "instances": ["chat"], "max_prompt_tokens": 4096},
                ]
            }
        }
        with gateway(config) as gw:
            too_long, _ = ask(gw.url, LONG)
    assert too_long.status_code == 400
    assert (
        "longer than every pool of 'm' takes (max_prompt_tokens: interactive 4096)"
        in (too_long.json()["error"]["message"])
    )


def test_a_wait_budget_shorter_than_the_swap_relays_or_answers_503_at_once() -> None:
    with (
        simulator(models=("r", "o"), load_time=5.0) as node,
        simulator("openai", models=("remote",)) as relay,
    ):
        config = {
            "routing": {"poll_interval": "1h", "expected_swap": "5s"},
            "relays": {"cloud": {"url": f"{relay.url}/v1"}},
            "instances": [instance("node", node)],
            "models": {
                "r": {"relay": "cloud", "relay_model": "remote", "fallback": "slow"},
                "o": {"relay": "cloud", "fallback": "off"},
            },
        }
        with gateway(config) as gw:
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            budget = {"x-swapgate-max-wait": "1s"}
            started = time.monotonic()
            relayed = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json={**body, "model": "r"},
                headers=budget,
                timeout=30,
            )
            relayed_in = time.monotonic() - started
            started = time.monotonic()
            refused = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json={**body, "model": "o"},
                headers=budget,
                timeout=30,
            )
            refused_in = time.monotonic() - started
            bad = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json={**body, "model": "o"},
                headers={"x-swapgate-max-wait": "soon"},
                timeout=30,
            )
    assert relayed.status_code == 200
    assert relayed.headers["x-swapgate-route"] == "relay/cloud"
    assert relayed_in < 1.0
    assert refused.status_code == 503
    assert int(refused.headers["retry-after"]) >= 4
    assert "x-swapgate-max-wait is 1s" in refused.json()["error"]["message"]
    assert refused_in < 1.0
    assert bad.status_code == 400
