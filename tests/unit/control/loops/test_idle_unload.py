"""The idle unload loop (swapgate/control/loops/idle_unload.py) over a live state whose clock,
and event loop, the test moves: a copy goes when its ttl or keep_alive says, through the same
eviction as a swap's, and never while it serves, is awaited or pinned."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from swapgate.control.loops.idle_unload import IdleUnloader
from swapgate.data.warm import WarmState
from tests.unit.fakes import ClockLoop, FakeClock, World, world


@dataclass
class Idle:
    world: World
    clock: FakeClock
    loop: ClockLoop
    unloader: IdleUnloader

    def after(self, seconds: float) -> None:
        self.loop.settle()  # what was told a moment ago is heard first
        self.clock.advance(seconds)
        self.loop.settle()

    def state(self, model: str = "m") -> WarmState:
        return self.world.state("gpu", model)

    def unloads(self, reason: str, model: str = "m") -> float:
        count = self.world.sample(
            "swapgate_unloads_total", instance="gpu", model=model, reason=reason
        )
        return count or 0.0


@pytest.fixture
def idle() -> Iterator[Idle]:
    clock = FakeClock()
    loop = ClockLoop(clock)
    config = {
        "instances": [{"name": "gpu", "url": "http://x", "models": ["m", "n"], "capacity": 2}],
        "models": {"m": {"ttl": "10s"}},
    }
    w = world(config, clock=clock)
    unloader = IdleUnloader(w.registry, w.coordinator, w.metrics, {"m": 10.0}, 30.0)
    w.warm("gpu", "m", "n")
    task = loop.create_task(unloader.run())
    loop.settle()
    try:
        yield Idle(w, clock, loop, unloader)
    finally:
        task.cancel()
        loop.run_until_complete(asyncio.wait({task}))
        loop.close()


def test_a_copy_idle_its_ttl_is_unloaded_and_counted(idle: Idle) -> None:
    idle.after(9.5)
    assert idle.state() is WarmState.WARM
    idle.after(0.6)
    assert idle.state() is WarmState.COLD
    assert ("unload", "m") in idle.world.drivers["gpu"].calls
    assert idle.unloads("ttl") == 1
    assert idle.state("n") is WarmState.WARM  # no ttl: never


def test_a_request_in_flight_holds_its_copy_and_its_end_starts_the_ttl_again(idle: Idle) -> None:
    traffic = idle.world.registry.traffic
    traffic.begin_request("gpu", "m")
    idle.after(60)
    assert idle.state() is WarmState.WARM
    traffic.end_request("gpu", "m")
    idle.after(9)
    assert idle.state() is WarmState.WARM
    idle.after(1.5)
    assert idle.state() is WarmState.COLD


def test_requests_waiting_for_a_copy_or_a_pin_hold_it(idle: Idle) -> None:
    registry = idle.world.registry
    registry.traffic.wait_on("gpu", "m", +1, for_slot=True)
    idle.after(30)
    assert idle.state() is WarmState.WARM
    registry.traffic.wait_on("gpu", "m", -1, for_slot=True)
    registry.operator.pin("gpu", "m", idle.clock() + 100)
    idle.after(105)  # the pin ended 5 s ago: its idle time counts from then
    assert idle.state() is WarmState.WARM
    idle.after(5.5)
    assert idle.state() is WarmState.COLD


def test_keep_alive_zero_unloads_right_after_the_answer(idle: Idle) -> None:
    traffic = idle.world.registry.traffic
    traffic.begin_request("gpu", "n")
    idle.unloader.asked("gpu", "n", 0.0)
    idle.after(1)
    assert idle.state("n") is WarmState.WARM  # it serves still
    traffic.end_request("gpu", "n")
    idle.after(0.25)  # the loop settles a moment after a change
    assert idle.state("n") is WarmState.COLD
    assert idle.unloads("keep_alive", "n") == 1
    assert idle.unloads("ttl", "n") == 0


def test_keep_alive_minus_one_keeps_a_copy_past_its_ttl_until_another_request_says(
    idle: Idle,
) -> None:
    idle.unloader.asked("gpu", "m", None)
    idle.after(3600)
    assert idle.state() is WarmState.WARM
    assert idle.unloader.deadline("gpu", "m") is None
    idle.unloader.asked("gpu", "m", 5.0)
    idle.after(0.3)
    assert idle.state() is WarmState.COLD
    assert idle.unloads("keep_alive") == 1


def test_once_unloaded_a_copy_loaded_again_goes_by_its_ttl(idle: Idle) -> None:
    idle.unloader.asked("gpu", "m", 0.0)
    idle.after(0.3)
    assert idle.state() is WarmState.COLD
    idle.world.warm("gpu", "m")
    idle.after(0.3)
    assert idle.state() is WarmState.WARM  # the keep_alive went with the copy it was asked of
    assert idle.unloader.deadline("gpu", "m") == pytest.approx(idle.clock() + 9.7)


def test_a_swap_running_on_the_instance_holds_its_copies(idle: Idle) -> None:
    idle.world.registry.swap_marks.begin_swap("gpu", "other", 60)
    idle.after(30)
    assert idle.state() is WarmState.WARM


def test_routing_ttl_is_the_ttl_of_every_model_that_sets_none_and_0_is_never(idle: Idle) -> None:
    # Ollama's OLLAMA_KEEP_ALIVE: n sets no ttl and takes the default; m's own 0 is never
    idle.unloader.configure({"m": 0.0}, 30.0, default=20.0)
    idle.after(19.5)
    assert idle.state("n") is WarmState.WARM
    idle.after(1)
    assert idle.state("n") is WarmState.COLD
    assert idle.unloads("ttl", model="n") == 1
    idle.after(120)
    assert idle.state() is WarmState.WARM, "its own ttl 0: never, whatever the default"
    idle.unloader.configure({}, 30.0, default=20.0)  # m's own ttl removed: the default holds
    idle.after(20.5)
    assert idle.state() is WarmState.COLD
