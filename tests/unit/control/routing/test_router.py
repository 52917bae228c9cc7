"""The router's rules in-process (queue limit, max_wait, starvation, fallback), the failover
rule and the preloader: fast, with fake drivers and the real registry and coordinator."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.router import Router
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.lease import Progress
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers import make_driver
from swapgate.errors import NoCapacity, QueueFull
from swapgate.errors import PathNotFound as NotFound
from swapgate.metrics import Metrics
from swapgate.policy.retry import MAY_HAVE_RUN, Failure, Next
from swapgate.proxy.pipeline.send import _query
from tests.unit.fakes import FakeClock, HeldDriver, World, eventually, recheck_at_once, world

RELAY = {"hosted": {"url": "https://relay.example/v1"}}


def one_instance(routing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
        "routing": {"min_residency": 0, **(routing or {})},
        **extra,
    }


async def test_a_cold_model_is_swapped_in_once_for_all_its_waiters() -> None:
    w = world(one_instance())
    w.warm("x")
    leases = await asyncio.gather(*(w.router.acquire("a") for _ in range(5)))
    assert {lease.name for lease in leases} == {"x"}
    assert w.drivers["x"].calls == [("load", "a")]
    assert w.registry.snapshot().instance("x").inflight == 5
    for lease in leases:
        w.router.release(lease)
    assert w.registry.snapshot().instance("x").inflight == 0


async def test_past_queue_limit_a_request_is_429_or_relayed_when_the_policy_allows() -> None:
    w = world(one_instance({"queue_limit": 2}), delay=0.3)
    w.warm("x")
    waiting = [asyncio.create_task(w.router.acquire("a")) for _ in range(2)]
    assert await eventually(lambda: w.registry.queues.depths() == {"a": 2})
    with pytest.raises(QueueFull) as refused:
        await w.router.acquire("a")
    assert refused.value.status == 429
    assert refused.value.retry_after is not None
    await asyncio.gather(*waiting)
    assert w.registry.queues.depths() == {}

    relayed_a = {"a": {"relay": "hosted", "fallback": "error"}}
    r = world(one_instance({"queue_limit": 1}, relays=RELAY, models=relayed_a), delay=0.3)
    r.warm("x")
    first = asyncio.create_task(r.router.acquire("a"))
    assert await eventually(lambda: r.registry.queues.depths() == {"a": 1})
    relayed = await r.router.acquire("a")
    assert relayed.route == "relay/hosted"
    assert r.sample("swapgate_fallbacks_total", model="a", relay="hosted", reason="queue_full")
    await first


async def test_max_wait_ends_the_wait_with_503_and_leaves_nothing_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recheck_at_once(monkeypatch)
    clock = FakeClock()
    w = world(one_instance({"max_wait": "200ms"}), delay=5, clock=clock)
    w.warm("x")
    waiting = asyncio.create_task(w.router.acquire("a", Progress()))
    assert await eventually(lambda: w.registry.queues.depths() == {"a": 1})
    clock.advance(0.19)
    assert not await eventually(waiting.done, within=0.05), "inside max_wait it waits"
    clock.advance(0.02)
    with pytest.raises(NoCapacity) as timed_out:
        await asyncio.wait_for(waiting, 2)
    assert "max_wait" in timed_out.value.message
    assert w.registry.queues.depths() == {}
    assert w.registry.snapshot().instance("x").models["a"].waiting == 0
    await w.coordinator.aclose()


async def test_a_request_starving_behind_a_busy_model_gets_its_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recheck_at_once(monkeypatch)
    clock = FakeClock()
    config = one_instance({"min_residency": "1h", "max_wait": "2s", "starvation_after": 0.1})
    w = world(config, delay=0.01, clock=clock)
    w.warm("x", "b")
    busy = await w.router.acquire("b")  # b is in use, and inside min_residency
    waiting = asyncio.create_task(w.router.acquire("a"))

    def closed() -> bool:
        view = w.registry.snapshot().instance("x")
        return view.models["b"].closing and view.reserved_for == "a"

    assert await eventually(lambda: w.registry.queues.depths() == {"a": 1})
    clock.advance(0.19)  # not yet 0.1 × max_wait: b serves on
    assert not await eventually(closed, within=0.05)
    clock.advance(0.02)  # past it: the rule closes b for a
    assert await eventually(closed)
    assert not waiting.done()
    w.router.release(busy)  # b drains; a gets the room
    lease = await asyncio.wait_for(waiting, 1.5)
    assert lease.name == "x"
    assert w.state("x", "a") is WarmState.WARM
    assert w.drivers["x"].calls == [("unload", "b"), ("load", "a")]


async def test_the_swap_policy_relays_at_once_and_still_starts_the_swap() -> None:
    config = one_instance(relays=RELAY, models={"a": {"relay": "hosted", "fallback": "swap"}})
    w = world(config, delay=0.1)
    w.warm("x")
    lease = await w.router.acquire("a")
    assert lease.route == "relay/hosted"
    assert w.state("x", "a") is WarmState.LOADING  # the next requests will find it warm
    await w.coordinator.wait("x")
    assert (await w.router.acquire("a")).route == "instance/x"


async def test_fallback_off_never_relays() -> None:
    config = one_instance(
        {"max_wait": "100ms"}, relays=RELAY, models={"a": {"relay": "hosted", "fallback": "off"}}
    )
    w = world(config, delay=5)
    w.warm("x")
    with pytest.raises(NoCapacity):
        await w.router.acquire("a")
    assert w.sample("swapgate_fallbacks_total", model="a", relay="hosted", reason="error") is None
    await w.coordinator.aclose()


def two_instances(**model: Any) -> dict[str, Any]:
    return {
        "instances": [
            {"name": "x", "url": "http://x", "models": ["a"]},
            {"name": "y", "url": "http://y", "models": ["a"]},
        ],
        "relays": RELAY,
        "models": {"a": model} if model else {},
    }


async def test_failover_tries_one_other_warm_instance_then_the_relay_then_gives_up() -> None:
    w = world(two_instances(relay="hosted", fallback="error"))
    w.warm("x", "a")
    w.warm("y", "a")
    attempts = Attempts(w.router, "a")
    first = await attempts.first(Progress())
    assert attempts.after(Failure.REFUSED, 0.0, True) is Next.OTHER
    second = attempts.lease
    assert second is not None
    assert {first.name, second.name} == {"x", "y"}
    inflight = {i.name: i.inflight for i in w.registry.snapshot().instances}
    assert inflight == {first.name: 0, second.name: 1}  # the failed lease went back
    assert attempts.after(Failure.REFUSAL, 0.0, True) is Next.RELAY
    assert attempts.lease is not None
    assert attempts.lease.route == "relay/hosted"
    assert attempts.after(Failure.REFUSAL, 0.0, True) is None  # nothing after the relay
    attempts.release()
    assert all(i.inflight == 0 for i in w.registry.snapshot().instances)


async def test_failover_without_a_relay_keeps_the_failed_lease_until_released() -> None:
    w = world(two_instances())
    w.warm("x", "a")  # y has nothing warm: no other instance to try
    attempts = Attempts(w.router, "a")
    first = await attempts.first(Progress())
    assert attempts.after(Failure.KEY, 0.0, True) is None
    assert attempts.lease == first
    attempts.release()
    attempts.release()  # once only
    assert w.registry.snapshot().instance("x").inflight == 0


async def test_a_request_that_may_have_crashed_its_engine_goes_nowhere_else() -> None:
    """Held past MAY_HAVE_RUN, then closed: not to the other warm copy, not back; closed at
    once: back to its own instance once (a kept-alive connection closed under it), then to
    the other copy, then the relay, then nowhere."""
    w = world(two_instances(relay="hosted", fallback="error"))
    w.warm("x", "a")
    w.warm("y", "a")
    slow = Attempts(w.router, "a")
    first = await slow.first(Progress())
    assert slow.after(Failure.CLOSED, MAY_HAVE_RUN + 1, True) is None
    assert slow.lease == first
    slow.release()
    quick = Attempts(w.router, "a")
    first = await quick.first(Progress())
    assert quick.after(Failure.BODILESS, 0.01, True) is Next.SAME
    assert quick.lease is not None
    assert quick.lease.name == first.name
    assert quick.after(Failure.BODILESS, 0.01, True) is Next.OTHER
    assert quick.lease is not None
    assert quick.lease.name != first.name
    assert quick.after(Failure.CLOSED, 0.01, True) is Next.RELAY
    assert quick.after(Failure.CLOSED, 0.01, True) is None, "each place once, not forever"
    quick.release()
    assert all(i.inflight == 0 for i in w.registry.snapshot().instances)


async def test_a_preload_waits_out_min_residency_and_fails_at_swap_timeout() -> None:
    w = world(one_instance({"min_residency": "1h", "swap_timeout": "300ms"}))
    w.warm("x", "b")
    w.router.release(await w.router.acquire("b"))  # b was just used
    result = await w.preloader.preload("a")
    assert not result.ok
    assert result.error is not None
    assert "swap_timeout" in result.error
    assert w.state("x", "b") is WarmState.WARM


async def test_a_preload_evicts_an_idle_model_and_pins_its_own() -> None:
    w = world(one_instance())
    w.warm("x", "b")
    result = await w.preloader.preload("a", pin_for=60)
    assert result.ok
    assert result.instances == ("x",)
    view = w.registry.snapshot().instance("x")
    assert view.state_of("a") is WarmState.WARM
    assert view.state_of("b") is WarmState.COLD
    assert view.models["a"].pinned_until > view.models["a"].since


@pytest.mark.parametrize("cancels", [True, False])
async def test_a_swap_nobody_waits_for_is_abandoned_for_the_model_queued_behind_it(
    cancels: bool,
) -> None:
    w = world(one_instance({"min_residency": "1h"}), delay=1.0)
    w.drivers["x"].cancels_loads = cancels
    w.warm("x")
    gone = asyncio.create_task(w.router.acquire("a"))  # its swap starts: 1 s
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(w.router.acquire("b"))  # queues behind a's swap
    await asyncio.sleep(0.1)
    started = time.monotonic()
    gone.cancel()  # a's only waiter goes: nobody wants a any more, b waits
    lease = await asyncio.wait_for(queued, 3)
    assert lease.name == "x"
    waited = time.monotonic() - started
    if cancels:  # the load is stopped at once and b loads: 1 s, not a's remaining 0.85 s + 1 s
        assert waited < 1.6
        assert w.drivers["x"].calls == [("load", "a"), ("cancelled", "a"), ("load", "b")]
    else:  # a's load finishes, then a is the first victim, inside its residency
        assert w.drivers["x"].calls == [("load", "a"), ("unload", "a"), ("load", "b")]
    assert w.sample("swapgate_swaps_total", instance="x", model="a", result="abandoned") == 1
    assert w.sample("swapgate_swaps_total", instance="x", model="a", result="ok") is None
    snap = w.registry.snapshot()
    assert snap.instance("x").available(snap.now)  # abandoned is not failed: no backoff
    w.router.release(lease)


async def test_a_swap_nobody_waits_for_goes_on_when_nothing_else_is_queued() -> None:
    w = world(one_instance(), delay=0.5)
    w.drivers["x"].cancels_loads = True
    w.warm("x")
    gone = asyncio.create_task(w.router.acquire("a"))
    await asyncio.sleep(0.1)
    gone.cancel()
    await w.coordinator.wait("x")
    assert w.state("x", "a") is WarmState.WARM  # it may be wanted soon: keep it
    assert w.sample("swapgate_swaps_total", instance="x", model="a", result="ok") == 1


async def test_a_preload_nobody_waits_for_is_not_abandoned() -> None:
    w = world(one_instance(), delay=0.5)
    w.drivers["x"].cancels_loads = True
    w.warm("x")
    w.coordinator.start("x", "a")  # a preload: no request ever waited for it
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(w.router.acquire("b"))
    lease = await asyncio.wait_for(queued, 3)
    assert w.drivers["x"].calls == [("load", "a"), ("unload", "a"), ("load", "b")]
    w.router.release(lease)


async def test_a_llama_router_lease_carries_autoload_false_after_the_clients_query() -> None:
    config = {"instances": [{"name": "r", "kind": "llama-router", "url": "http://r:8080"}]}
    settings = parse_config(config)
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog)
    async with httpx.AsyncClient() as client:
        driver = make_driver(settings.instances[0], client)
        times = SwapTimes(settings.routing.expected_swap)
        swaps = SwapCoordinator(registry, {"r": driver}, catalog, times, Metrics(), 60.0)
        router = Router(settings, registry, swaps, catalog, Metrics(), {"r": driver})
        registry.polls.apply_report("r", InstanceReport({"a": WarmState.WARM}, frozenset("a")), 0)
        lease = await router.acquire("a")
    assert lease.upstream.query == "autoload=false"
    assert _query({"query_string": b"x=1"}, lease.upstream.query) == "?x=1&autoload=false"
    assert _query({"query_string": b""}, lease.upstream.query) == "?autoload=false"
    assert _query({"query_string": b""}) == ""


def speaking(protocols: list[str], **model: Any) -> Router:
    config = {
        "instances": [{"name": "x", "url": "http://x", "models": ["a"], "protocols": protocols}],
        "relays": RELAY,
        "models": {"a": model},
    }
    settings = parse_config(config)
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog)
    swaps = SwapCoordinator(registry, {}, catalog, SwapTimes(None), Metrics(), 60.0)
    return Router(settings, registry, swaps, catalog, Metrics())


@pytest.mark.parametrize(
    ("protocols", "protocol", "served"),
    [
        (["openai"], "responses", True),  # translated to chat
        (["openai"], "anthropic", True),
        (["anthropic"], "anthropic", True),
        (["anthropic"], "responses", False),  # no chat to translate it to
        (["anthropic"], "openai", False),
        (["openai", "responses"], "responses", True),
    ],
)
def test_a_request_no_instance_can_take_is_refused_before_any_swap(
    protocols, protocol, served
) -> None:
    router = speaking(protocols)
    if served:
        router.intake.check_speaks("a", protocol, "/v1/x")
    else:
        with pytest.raises(NotFound, match="no instance of 'a' speaks /v1/x"):
            router.intake.check_speaks("a", protocol, "/v1/x")
    speaking(protocols, relay="hosted").intake.check_speaks("a", protocol, "/v1/x")  # the relay may


async def test_memory_alone_limits_what_is_resident_when_capacity_is_unset() -> None:
    """docs/memory.md's instance with `memory` and no `capacity`: two 10 GiB models share
    24 GiB; a third that does not fit evicts one."""
    w = world(
        {
            "instances": [
                {"name": "x", "url": "http://x", "models": ["a", "b", "c"], "memory": "24GiB"}
            ],
            "models": {m: {"memory": "10GiB"} for m in "abc"},
            "routing": {"min_residency": 0},
        }
    )
    w.warm("x")  # up, nothing loaded
    for model in ("a", "b", "c"):
        w.router.release(await w.router.acquire(model))
    assert w.drivers["x"].calls == [("load", "a"), ("load", "b"), ("unload", "a"), ("load", "c")]
    assert w.settings.instances[0].limited_by == "memory 24 GiB"


async def test_past_max_concurrency_requests_queue_and_go_by_class_then_arrival() -> None:
    from swapgate.control.routing.waiter import Routing

    w = world(one_instance(models={"a": {"max_concurrency": 1}}))
    w.warm("x", "a")
    first = await w.router.acquire("a")
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        lease = await w.router.acquire("a", Progress(), Routing(priority=priority))
        order.append(name)
        await asyncio.sleep(0.01)
        w.router.release(lease)

    batch = asyncio.create_task(wait("batch", -10))
    assert await eventually(lambda: w.registry.queues.depths() == {"a": 1})
    default = asyncio.create_task(wait("default", 0))
    interactive = asyncio.create_task(wait("interactive", 10))
    assert await eventually(lambda: w.registry.queues.depths() == {"a": 3})
    assert w.registry.snapshot().instance("x").models["a"].inflight == 1, "none reached it"
    w.router.release(first)
    await asyncio.gather(batch, default, interactive)
    assert order == ["interactive", "default", "batch"]
    assert w.drivers["x"].calls == [], "no swap: a was warm all along"


async def test_a_model_that_fits_no_instance_is_refused_without_a_retry_after() -> None:
    """A retry would meet the same config: the answer says what the operator should change,
    and gives no Retry-After for clients to wait on."""
    config = {
        "instances": [{"name": "x", "url": "http://x", "models": ["a"], "memory": "24GiB"}],
        "models": {"a": {"memory": "30GiB"}},
    }
    w = world(config)
    w.warm("x")
    with pytest.raises(NoCapacity) as refused:
        await w.router.acquire("a")
    assert refused.value.retry_after is None
    assert "larger than the memory of every instance" in refused.value.message
    assert "swapgate plan" in refused.value.message
    assert w.drivers["x"].calls == []


def selector(strategy: str) -> World:
    choose = {"from": ["a", "b", "c"], "strategy": strategy}
    config = one_instance(models={"coder": {"choose": choose}})
    config["instances"][0]["models"] = ["a", "b", "c"]
    w = world(config, driver=HeldDriver)
    w.warm("x")
    return w


async def test_a_selector_goes_to_its_first_target_warm_then_waking_then_cached() -> None:
    w = selector("warm")
    assert w.router.intake.chosen("a") == "a", "a model is no selector"
    assert w.router.intake.chosen("coder") == "a", "nothing warm, nothing cached: the first target"
    w.coordinator.times.tiers = lambda model: "cached" if model == "b" else "disk"
    assert w.router.intake.chosen("coder") == "b"
    assert w.coordinator.start("x", "c")  # loading beats weights in RAM
    assert w.router.intake.chosen("coder") == "c"
    held = w.drivers["x"]
    assert isinstance(held, HeldDriver)
    assert await eventually(lambda: "c" in held.loading)
    held.finish("c")
    assert await w.coordinator.wait("x")
    w.warm("x", "b", "c")  # both warm: the first of them in the selector's order
    assert w.router.intake.chosen("coder") == "b"

    first = selector("first")
    first.warm("x", "c")
    assert first.router.intake.chosen("coder") == "a"
