from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.loops import poller as poller_module
from swapgate.control.loops.poller import Poller
from swapgate.control.state.registry import Registry
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.errors import DriverError, DriverTimeout
from swapgate.metrics import Metrics
from tests.unit.fakes import eventually


class Flaky:
    """Answers with ``a`` warm unless ``failing``."""

    failing: type[DriverError] | None = None
    polls_while_busy = True
    asked = 0
    during: Callable[[], None] = staticmethod(lambda: None)  # what happens while it is asked

    async def state(self) -> InstanceReport:
        self.asked += 1
        self.during()
        if self.failing is not None:
            raise self.failing("no answer")
        return InstanceReport({"a": WarmState.WARM}, None)

    async def changes(self) -> AsyncIterator[None]:
        return
        yield


def state(registry: Registry, model: str) -> WarmState:
    return registry.snapshot().instance("x").state_of(model)


async def test_one_failed_poll_is_forgiven_two_take_the_instance_down() -> None:
    settings = parse_config({"instances": [{"name": "x", "url": "http://x"}]})
    registry = Registry(settings.instances, Catalog(settings))
    driver = Flaky()
    poller = Poller(registry, {"x": driver}, Metrics(), interval=1)
    await poller.poll("x")
    driver.failing = DriverError
    await poller.poll("x")
    assert registry.is_up("x")
    await poller.poll("x")
    assert not registry.is_up("x")
    assert state(registry, "a") is WarmState.COLD
    driver.failing = None
    await poller.poll("x")
    assert registry.is_up("x")


def busy_instance() -> tuple[Registry, Flaky, Poller]:
    settings = parse_config({"instances": [{"name": "x", "url": "http://x"}]})
    registry = Registry(settings.instances, Catalog(settings))
    driver = Flaky()
    poller = Poller(registry, {"x": driver}, Metrics(), interval=1)
    return registry, driver, poller


async def test_polls_that_time_out_while_answers_stream_are_busy_not_down() -> None:
    registry, driver, poller = busy_instance()
    await poller.poll("x")
    registry.traffic.begin_request("x", "a")
    driver.failing = DriverTimeout
    driver.during = registry.pulse("x").beat  # a byte arrives while each poll waits
    for _ in range(3):
        await poller.poll("x")
    assert registry.is_up("x")
    assert state(registry, "a") is WarmState.WARM


async def test_polls_that_time_out_while_nothing_moves_take_the_instance_down() -> None:
    registry, driver, poller = busy_instance()
    await poller.poll("x")
    registry.traffic.begin_request("x", "a")  # in flight, but its answer stalls
    registry.pulse("x").beat()
    driver.failing = DriverTimeout
    await poller.poll("x")
    await poller.poll("x")
    assert not registry.is_up("x")


async def test_a_refused_poll_is_a_failure_even_while_answers_stream() -> None:
    registry, driver, poller = busy_instance()
    await poller.poll("x")
    registry.traffic.begin_request("x", "a")
    driver.failing = DriverError  # not a timeout: the server is gone
    driver.during = registry.pulse("x").beat
    for _ in range(2):
        await poller.poll("x")
    assert not registry.is_up("x")


async def test_an_engine_that_a_poll_would_interrupt_is_not_polled_while_it_serves() -> None:
    registry, driver, poller = busy_instance()
    driver.polls_while_busy = False
    await poller.poll("x")
    registry.traffic.begin_request("x", "a")  # no byte of its answer yet: still reading its prompt
    await poller.poll("x")
    assert driver.asked == 1, "skipped while a request is in flight"
    assert registry.is_up("x")
    registry.traffic.end_request("x", "a")
    await poller.poll("x")
    assert driver.asked == 2, "polled again once nothing is in flight"


async def test_a_failed_poll_is_confirmed_soon_not_at_the_next_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hung instance is down after its poll timeout twice, not two intervals: the second
    poll follows the first failure by CONFIRM_AFTER (docs/operations.md)."""
    monkeypatch.setattr(poller_module, "CONFIRM_AFTER", 0.01)
    registry, driver, poller = busy_instance()
    poller._interval = 3600.0  # the next round would never come within the test
    await poller.poll("x")
    running = asyncio.create_task(poller.run())
    try:
        driver.failing = DriverTimeout
        await poller.poll("x")  # the round's poll fails: suspect
        assert registry.is_up("x")
        assert await eventually(lambda: not registry.is_up("x"))
        assert driver.asked == 3
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_request_that_failed_by_its_connection_has_its_instance_polled_soon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(poller_module, "CONFIRM_AFTER", 0.01)
    registry, driver, poller = busy_instance()
    poller._interval = 3600.0
    await poller.poll("x")
    running = asyncio.create_task(poller.run())
    try:
        registry.polls.suspect("x")  # as the data plane does after a closed connection
        assert await eventually(lambda: driver.asked == 2)
        assert registry.is_up("x"), "it answered: up, as it was"
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
