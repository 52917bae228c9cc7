"""A request's tries beyond its first lease, in-process: another model when its swap fails or
its prompt is past the context, and swapgate's queue when an instance says 429 for its own
concurrency limit (with fake drivers and the real registry, coordinator and router)."""

from __future__ import annotations

import asyncio
import time

import pytest

from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.waiter import Routing
from swapgate.data.lease import Progress
from swapgate.errors import NoCapacity, SwapFailed
from tests.unit.fakes import World, eventually, world


def apart(**routing: object) -> World:
    """x serves a, y serves b, both up with nothing warm."""
    w = world(
        {
            "instances": [
                {"name": "x", "url": "http://x", "models": ["a"]},
                {"name": "y", "url": "http://y", "models": ["b"]},
            ],
            "routing": {"min_residency": 0, **routing},
        }
    )
    w.warm("x")
    w.warm("y")
    return w


async def test_a_failed_swap_goes_on_with_the_model_that_answers_instead() -> None:
    w = apart()
    w.drivers["x"].fail = True
    asked: list[str] = []

    def instead() -> tuple[str, Routing]:
        asked.append("instead")
        return "b", Routing()

    attempts = Attempts(w.router, "a", Routing(), instead)
    lease = await attempts.first(Progress())
    assert (lease.name, lease.model) == ("y", "b")
    assert asked == ["instead"]
    assert w.drivers["y"].calls == [("load", "b")]
    assert w.registry.snapshot().instance("y").inflight == 1
    attempts.release()
    assert w.registry.snapshot().instance("y").inflight == 0

    alone = Attempts(w.router, "a", Routing(), lambda: None)
    with pytest.raises(SwapFailed):
        await alone.first(Progress())
    alone.release()
    assert all(i.inflight == 0 for i in w.registry.snapshot().instances)


async def test_instead_gives_the_lease_back_and_serves_the_other_model() -> None:
    """An engine refused the prompt as past its context: the first lease goes back at once
    and the request is one for the other model from its first lease on."""
    w = apart()
    w.warm("x", "a")
    attempts = Attempts(w.router, "a", Routing())
    first = await attempts.first(Progress())
    assert first.name == "x"
    lease = await attempts.instead(Progress(), "b", Routing())
    assert (lease.name, lease.model) == ("y", "b")
    inflight = {i.name: i.inflight for i in w.registry.snapshot().instances}
    assert inflight == {"x": 0, "y": 1}
    attempts.release()
    assert all(i.inflight == 0 for i in w.registry.snapshot().instances)


async def test_a_429_waits_in_swapgates_queue_for_the_request_in_flight_there() -> None:
    """x refused a second request for its own limit while one is in flight there: it waits,
    without the instance's Retry-After, until that one ends, then takes its slot."""
    w = apart()
    w.warm("x", "a")
    busy = Attempts(w.router, "a", Routing())
    await busy.first(Progress())
    limited = Attempts(w.router, "a", Routing())
    await limited.first(Progress())
    started = time.monotonic()
    waiting = asyncio.create_task(limited.wait_for_room(Progress(), pause=30.0))
    assert await eventually(lambda: w.registry.queues.depths() == {"a": 1})
    assert w.registry.snapshot().instance("x").inflight == 1, "the refused lease went back"
    assert w.sample("swapgate_upstream_errors_total", instance="x", kind="concurrency_limit")
    busy.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert lease.name == "x"
    assert time.monotonic() - started < 5, "it did not wait out the Retry-After"
    limited.release()
    assert w.registry.snapshot().instance("x").inflight == 0


async def test_a_429_with_nothing_else_in_flight_ends_at_max_wait_with_a_retry_after() -> None:
    w = apart(max_wait="50ms")
    w.warm("x", "a")
    attempts = Attempts(w.router, "a", Routing())
    await attempts.first(Progress())
    with pytest.raises(NoCapacity) as refused:
        await attempts.wait_for_room(Progress(), pause=0.1)
    assert refused.value.retry_after == 1
    assert "x kept refusing 'a' for its concurrency limit for 0.05s" in str(refused.value)
    attempts.release()
    assert w.registry.snapshot().instance("x").inflight == 0
