"""``models.M.fallbacks`` through a real gateway (docs/configuration.md, "Fallback models"):
another model of the gateway answers a request its own cannot serve, once, and says so.

Two simulators fail every load (``a``, ``e``; ``d``, ``f``); another serves the rest. ``big``
fits no instance; ``slow`` takes longer to swap in than a request's wait budget allows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Gateway, chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "fallbacks-admin-token"
MAIN_KEY = "sk-main-fallbacks"
ONLY_A_KEY = "sk-only-a-fallbacks"
ENV = {"TEST_ADMIN_TOKEN": TOKEN}


def _key(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), **fields}


def _auth(key: str = MAIN_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with (
        simulator(models=("a", "e"), load_time=1.0, fail_load_rate=1.0) as broken,
        simulator(models=("d", "f"), load_time=1.0, fail_load_rate=1.0) as broken_too,
        simulator(models=("b", "c", "big", "slow"), load_time=0.3, capacity=4) as good,
    ):
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            # expected_swap: the ETA a wait budget is held to, before any swap is measured
            "routing": {"poll_interval": "200ms", "min_residency": 0, "expected_swap": "10s"},
            # No early 200 but where a test asks for it: most read the final headers
            "keepalive": {"early_headers_after": "30s"},
            "instances": [
                instance("broken", broken, capacity=4),
                # d and f fail on an instance of their own: one whose two models failed backs
                # off whole, and they must meet theirs without a backoff
                instance("broken-too", broken_too),
                instance("good", good, capacity=4, memory="24GiB"),
            ],
            "models": {
                "a": {"fallbacks": ["b"]},
                "e": {"fallbacks": ["d"]},
                "d": {"fallbacks": ["b"]},
                "f": {"fallbacks": ["b"], "keepalive": {"early_headers_after": "200ms"}},
                "big": {"fallbacks": ["c"], "memory": "30GiB"},
                "slow": {"fallbacks": ["b"]},
                "b": {"memory": "1GiB"},
                "c": {"memory": "1GiB"},
            },
            "auth": {"keys": [_key("main", MAIN_KEY), _key("only-a", ONLY_A_KEY, models=["a"])]},
            "activity": {"path": ":memory:"},
        }
        with gateway(config, ENV) as gw:
            yield gw


def _fallbacks(gw: Gateway, model: str, to: str, reason: str) -> float:
    return gw.metric("swapgate_model_fallbacks_total", model=model, to=to, reason=reason)


def _rows(gw: Gateway) -> list[dict[str, Any]]:
    with gw.admin(TOKEN) as admin:
        page = admin.get("/admin/activity", params={"limit": 100})
    assert page.status_code == 200, page.text
    rows: list[dict[str, Any]] = page.json()["rows"]
    return rows


def test_a_failed_swap_is_answered_by_the_next_model_then_its_backoff_too(gw: Gateway) -> None:
    plain = chat(gw.url, "b", headers=_auth())
    assert plain.status_code == 200, plain.text
    assert "x-swapgate-model" not in plain.headers, "a model that serves keeps its request"

    failed_over = chat(gw.url, "a", headers=_auth())
    assert failed_over.status_code == 200, failed_over.text
    assert failed_over.headers["x-swapgate-model"] == "b"
    assert failed_over.headers["x-swapgate-route"] == "instance/good"
    assert failed_over.json()["model"] == "b"
    assert _fallbacks(gw, "a", "b", "swap_failed") == 1

    backing_off = chat(gw.url, "a", headers=_auth())  # a backs off now: b answers at once
    assert backing_off.status_code == 200, backing_off.text
    assert backing_off.headers["x-swapgate-model"] == "b"
    assert _fallbacks(gw, "a", "b", "backoff") == 1

    refused = chat(gw.url, "a", headers=_auth(ONLY_A_KEY))  # its key may not use b
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "swap_failed"
    assert _fallbacks(gw, "a", "b", "backoff") == 1

    rows = {(r["model"], r["fallback_from"], r["fallback_reason"], r["status"]) for r in _rows(gw)}
    assert ("b", "a", "swap_failed", 200) in rows
    assert ("b", "a", "backoff", 200) in rows
    assert ("b", None, None, 200) in rows  # the plain request
    assert ("a", None, None, 503) in rows  # the key's


def test_a_fallback_models_own_fallbacks_are_not_followed(gw: Gateway) -> None:
    answer = chat(gw.url, "e", headers=_auth())  # e fails, d (its fallback) fails too
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "swap_failed"
    assert _fallbacks(gw, "e", "d", "swap_failed") == 1
    assert _fallbacks(gw, "d", "b", "swap_failed") == 0, "once per request: no chains"


def test_a_model_no_instance_can_hold_is_answered_by_its_fallback(gw: Gateway) -> None:
    answer = chat(gw.url, "big", headers=_auth())
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-swapgate-model"] == "c"
    assert answer.json()["model"] == "c"
    assert _fallbacks(gw, "big", "c", "unavailable") == 1


def test_a_wait_budget_shorter_than_the_swap_goes_to_a_warm_fallback(gw: Gateway) -> None:
    assert chat(gw.url, "b", headers=_auth()).status_code == 200  # b is warm
    budget = {**_auth(), "x-swapgate-max-wait": "2"}
    answer = chat(gw.url, "slow", headers=budget)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-swapgate-model"] == "b"
    assert _fallbacks(gw, "slow", "b", "wait_budget") == 1
    waits = chat(gw.url, "slow", headers=_auth())  # no budget: it waits for its own swap
    assert waits.status_code == 200, waits.text
    assert "x-swapgate-model" not in waits.headers
    assert waits.json()["model"] == "slow"


def test_after_early_headers_the_answers_model_field_names_the_fallback(gw: Gateway) -> None:
    body = {
        "model": "f",
        "stream": True,
        "max_tokens": 3,
        "messages": [{"role": "user", "content": "hi"}],
    }
    models: set[str] = set()
    with httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json=body, headers=_auth(), timeout=30
    ) as response:
        assert response.status_code == 200
        assert "x-swapgate-model" not in response.headers  # it went out before the swap failed
        for line in response.iter_lines():
            if line.startswith("data: {"):
                models.add(json.loads(line[6:])["model"])
    assert models == {"b"}
    wait_for(lambda: _fallbacks(gw, "f", "b", "swap_failed") == 1, timeout=5)
