"""Residency that knows who is waiting (swapgate/control/state/clients.py): a model idle within its
residency is evicted at once when every client that used it lately waits, with all it can have
open, for the model it keeps out (agents in lockstep); independent traffic keeps its residency.
Shown with the fake clock: nothing here waits out a residency."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swapgate.control.routing.failover import Attempts
from swapgate.control.state.clients import Clients
from swapgate.data.lease import Progress
from swapgate.data.warm import WarmState
from tests.unit.fakes import FakeClock, World, eventually, recheck_at_once, world


def rounds(clients: Clients, clock: FakeClock, model: str, agents: int, count: int) -> None:
    """``count`` rounds of ``agents`` requests at once for ``model``, each answered."""
    for _ in range(count):
        tickets = [clients.began("team", model) for _ in range(agents)]
        for ticket in tickets:
            clients.flying(ticket, True)
        for ticket in tickets:
            clients.ended(ticket)
        clock.advance(1)


def test_a_client_with_all_it_can_have_open_and_none_in_flight_is_closed() -> None:
    clock = FakeClock()
    clients = Clients(clock)
    rounds(clients, clock, "planner", agents=4, count=4)  # four agents in lockstep
    assert clients.unheld() == frozenset(), "nothing open: any of them may come back"
    coder = [clients.began("team", "coder") for _ in range(3)]
    assert clients.unheld() == frozenset(), "the fourth agent may still ask for the planner"
    coder.append(clients.began("team", "coder"))
    assert clients.unheld() == {"planner"}, "all four wait for the coder"
    clients.flying(coder[0], True)
    assert clients.unheld() == frozenset(), "one is served: its agent may ask for anything next"


def test_a_client_whose_concurrency_still_grows_is_not_taken_as_closed() -> None:
    clock = FakeClock()
    clients = Clients(clock)
    rounds(clients, clock, "planner", agents=1, count=2)
    rounds(clients, clock, "planner", agents=2, count=1)
    clients.began("team", "coder")
    assert clients.unheld() == frozenset(), "one of two open: the other may ask for anything"
    clients.began("team", "coder")
    assert clients.unheld() == {"planner"}, "two at once as often as it rose to two: learned"
    clients.began("team", "coder")
    assert clients.unheld() == frozenset(), "three at once: still growing, not a closed loop"


def test_another_client_that_used_the_model_lately_keeps_it() -> None:
    clock = FakeClock()
    clients = Clients(clock)
    rounds(clients, clock, "planner", agents=1, count=10)
    clients.ended(clients.began("person", "planner"))  # one that waits for nothing
    waiting = clients.began("team", "coder")
    assert clients.unheld() == frozenset(), "the person may come back for the planner"
    clients.ended(waiting)
    clock.advance(121)  # the person was last seen outside the window
    rounds(clients, clock, "planner", agents=1, count=4)
    clients.began("team", "coder")
    assert clients.unheld() == {"planner"}


def one_gpu() -> dict[str, Any]:
    return {
        "instances": [{"name": "gpu", "url": "http://gpu", "models": ["planner", "coder"]}],
        "routing": {"min_residency": "30s"},  # long: without the rule the coder waits it out
    }


async def agent_turns(w: World, model: str, agents: int) -> None:
    """``agents`` requests for ``model`` at once, each holding its lease until all have one."""
    routing = w.router.intake.routing_for(model, {}, None, client="team")
    attempts = [Attempts(w.router, model, routing) for _ in range(agents)]
    try:
        await asyncio.gather(*(a.first(Progress()) for a in attempts))
    finally:
        for each in attempts:
            each.release()


async def test_lockstep_agents_swap_to_the_coder_at_once_not_after_the_residency() -> None:
    clock = FakeClock()
    w = world(one_gpu(), clock=clock)
    w.warm("gpu", "planner")
    for _ in range(4):  # rounds of four agents on the planner
        await agent_turns(w, "planner", 4)
    coder = asyncio.create_task(agent_turns(w, "coder", 4))
    assert await eventually(coder.done)
    assert w.state("gpu", "coder") is WarmState.WARM, "swapped without waiting out 30 s"
    assert clock.now == 1000.0, "no time passed on the gateway's clock"


async def test_independent_traffic_keeps_the_residency() -> None:
    clock = FakeClock()
    w = world(one_gpu(), clock=clock)
    w.warm("gpu", "planner")
    await agent_turns(w, "planner", 1)
    await agent_turns(w, "planner", 2)
    # More at once than ever: arrivals that do not wait for answers, not a closed loop
    waiting = asyncio.create_task(agent_turns(w, "coder", 3))
    await asyncio.sleep(0.2)
    assert not waiting.done(), "the planner is held for its residency"
    clock.advance(31)
    w.registry.changes.notify()
    assert await eventually(waiting.done)


async def test_a_batch_of_one_model_passes_a_request_over_for_at_most_max_passover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recheck_at_once(monkeypatch)
    clock = FakeClock()
    config = {**one_gpu(), "routing": {"min_residency": "1h", "max_passover": "5s"}}
    w = world(config, delay=0.01, clock=clock)
    w.warm("gpu", "coder")
    batch = [await w.router.acquire("coder") for _ in range(3)]  # a batch keeps the coder busy
    planner = asyncio.create_task(agent_turns(w, "planner", 1))
    assert await eventually(lambda: w.registry.queues.depths() == {"planner": 1})
    clock.advance(4.9)
    w.router.release(batch.pop())
    batch.append(await w.router.acquire("coder"))  # more of the batch: still served
    clock.advance(0.2)  # past max_passover: the coder closes, its batch drains
    w.registry.changes.notify()
    assert await eventually(lambda: w.registry.snapshot().instance("gpu").models["coder"].closing)
    for lease in batch:
        w.router.release(lease)
    assert await eventually(planner.done)
    assert w.state("gpu", "planner") is WarmState.WARM
