"""Fallback models in-process (swapgate/proxy/pipeline/fallback_models.py and ``Attempts``): the
router's view of each model, the key's scope, once per request, and a swap that fails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swapgate.config.catalog import Catalog
from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.waiter import Routing
from swapgate.data.lease import Progress
from swapgate.errors import DriverError, SwapFailed
from swapgate.proxy.auth import ClientAuth
from swapgate.proxy.exchange import ModelFallback
from swapgate.proxy.pipeline.fallback_models import FallbackModels
from tests.unit.fakes import HeldDriver, World, eventually, world


def config(models: dict[str, Any], **routing: Any) -> dict[str, Any]:
    return {
        "instances": [{"name": "x", "url": "http://x", "models": ["a", "b", "c"]}],
        "routing": {"min_residency": 0, **routing},
        "models": models,
    }


def fallback(
    model: str, w: World, tokens: int = 10, allowed: Any = None, budget: Any = None
) -> ModelFallback:
    models = fallback_models(w)
    made = models.offer(
        model, allowed or (lambda m: True), lambda m: Routing(budget=budget), lambda: tokens
    )
    assert made is not None
    return made


def fallback_models(w: World) -> FallbackModels:
    contexts = Catalog(w.settings).contexts
    return FallbackModels(w.settings, w.router, w.metrics, contexts, (ClientAuth([]), {}))


def held(w: World) -> HeldDriver:
    driver = w.drivers["x"]
    assert isinstance(driver, HeldDriver)
    return driver


def answers(w: World, found: ModelFallback, routing: Routing | None = None) -> str | None:
    return fallback_models(w).at_admission(found, routing or Routing())


def test_a_model_that_serves_keeps_its_request() -> None:
    w = world(config({"a": {"fallbacks": ["b"], "context": 256}}))
    w.warm("x", "a", "b")
    found = fallback("a", w, tokens=200)
    assert answers(w, found) is None
    assert found.to is None
    assert w.sample("swapgate_model_fallbacks_total", model="a", to="b", reason="context") is None


def test_a_model_without_fallbacks_gives_no_fallback() -> None:
    w = world(config({"a": {"context": 256}}))
    models = fallback_models(w)
    assert models.offer("a", lambda m: True, lambda m: Routing(), lambda: 10**6) is None


def test_a_prompt_past_the_context_goes_to_the_next_model_once() -> None:
    w = world(config({"a": {"fallbacks": ["b", "c"], "context": 256}}))
    w.warm("x", "a", "b", "c")
    found = fallback("a", w, tokens=2000)
    assert answers(w, found) == "b"
    assert (found.to, found.reason) == ("b", "context")
    assert w.sample("swapgate_model_fallbacks_total", model="a", to="b", reason="context") == 1
    models = fallback_models(w)
    assert models.take(found, "swap_failed") is None, "once per request"


def test_a_fallback_the_key_may_not_use_is_skipped() -> None:
    w = world(config({"a": {"fallbacks": ["b", "c"], "context": 256}}))
    w.warm("x", "b", "c")
    found = fallback("a", w, tokens=2000, allowed=lambda m: m != "b")
    assert answers(w, found) == "c"


def test_a_fallback_too_short_for_the_prompt_is_skipped() -> None:
    w = world(config({"a": {"fallbacks": ["b", "c"], "context": 256}, "b": {"context": 512}}))
    w.warm("x")
    found = fallback("a", w, tokens=2000)
    assert answers(w, found) == "c"


def test_a_model_no_instance_can_hold_falls_back() -> None:
    conf = config({"a": {"fallbacks": ["b"], "memory": "30GiB"}})
    conf["instances"][0]["memory"] = "24GiB"
    w = world(conf)
    w.warm("x")
    found = fallback("a", w)
    assert answers(w, found) == "b"
    assert found.reason == "unavailable"


def test_a_wait_budget_shorter_than_the_swap_falls_back_to_a_warm_model() -> None:
    w = world(config({"a": {"fallbacks": ["b", "c"]}}, expected_swap="30s"))
    w.warm("x", "c")
    found = fallback("a", w, budget=5.0)
    # b is cold too: its swap would not fit the budget either; c is warm
    assert answers(w, found, Routing(budget=5.0)) == "c"
    assert found.reason == "wait_budget"
    assert w.drivers["x"].calls == [], "neither swap starts"


def test_without_a_budget_a_cold_model_waits_for_its_swap() -> None:
    w = world(config({"a": {"fallbacks": ["c"]}}, expected_swap="30s"))
    w.warm("x", "c")
    assert answers(w, fallback("a", w)) is None


async def test_a_failed_swap_goes_on_with_the_model_instead() -> None:
    w = world(config({"a": {"fallbacks": ["b"]}}), driver=HeldDriver)
    w.warm("x")
    asked: list[str] = []

    def instead() -> tuple[str, Routing] | None:
        asked.append("a")
        return "b", Routing()

    attempts = Attempts(w.router, "a", Routing(), instead)
    first = asyncio.create_task(attempts.first(Progress()))
    assert await eventually(lambda: "a" in held(w).loading)
    held(w).finish("a", DriverError("out of memory"))
    assert await eventually(lambda: "b" in held(w).loading)
    held(w).finish("b")
    lease = await asyncio.wait_for(first, 2)
    assert (lease.name, lease.model) == ("x", "b")
    assert asked == ["a"]
    attempts.release()
    assert w.registry.snapshot().instance("x").inflight == 0


async def test_a_failed_swap_without_a_fallback_is_the_answer() -> None:
    w = world(config({}), driver=HeldDriver)
    w.warm("x")
    attempts = Attempts(w.router, "a", Routing(), lambda: None)
    first = asyncio.create_task(attempts.first(Progress()))
    assert await eventually(lambda: "a" in held(w).loading)
    held(w).finish("a", DriverError("out of memory"))
    with pytest.raises(SwapFailed):
        await asyncio.wait_for(first, 2)
    attempts.release()
