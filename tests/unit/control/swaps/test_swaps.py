from __future__ import annotations

import asyncio
from typing import Any

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.errors import DriverError
from swapgate.metrics import Metrics
from swapgate.policy.placement import Policy, Queue, Serve, place
from tests.unit.fakes import FakeDriver, eventually, world

POLICY = Policy(min_residency=0.0)


def setup(
    driver: FakeDriver, swap_timeout: float = 5.0
) -> tuple[SwapCoordinator, Registry, Metrics]:
    settings = parse_config(
        {
            "instances": [{"name": "x", "url": "http://x"}],
            "models": {"a": {"upstream_names": {"x": "a:7b"}}},
        }
    )
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog)
    registry.polls.apply_report("x", InstanceReport({"b": WarmState.WARM}, None), 0)
    metrics = Metrics()
    coordinator = SwapCoordinator(
        registry, {"x": driver}, catalog, SwapTimes(30.0), metrics, swap_timeout
    )
    return coordinator, registry, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_one_swap_per_instance_however_many_ask() -> None:
    driver = FakeDriver()
    coordinator, registry, metrics = setup(driver)
    started = [coordinator.start("x", "a", ("b",)) for _ in range(5)]
    assert started == [True, False, False, False, False]
    assert registry.snapshot().instance("x").state_of("a") is WarmState.LOADING
    assert await coordinator.wait("x") is True
    assert driver.calls == [("unload", "b"), ("load", "a:7b")]
    view = registry.snapshot().instance("x")
    assert (view.state_of("a"), view.state_of("b"), view.swapping) == (
        WarmState.WARM,
        WarmState.COLD,
        None,
    )
    labels = {"instance": "x", "model": "a", "result": "ok"}
    assert sample(metrics, "swapgate_swaps_total", **labels) == 1
    tier = {**labels, "weights": "unknown"}  # no weight files known
    duration = sample(metrics, "swapgate_swap_duration_seconds_sum", **tier)
    assert duration is not None
    assert duration >= 0.05


async def test_a_failed_swap_backs_off_its_model_alone_and_is_counted() -> None:
    coordinator, registry, metrics = setup(FakeDriver(fail=True))
    coordinator.start("x", "a")
    assert await coordinator.wait("x") is False
    snap = registry.snapshot()
    view = snap.instance("x")
    assert view.state_of("a") is WarmState.COLD
    assert view.backing_off("a", snap.now)
    assert view.models["a"].failure == "boom"
    assert view.available(snap.now)  # b, warm there, keeps serving
    assert sample(metrics, "swapgate_swaps_total", instance="x", model="a", result="failed") == 1


async def test_two_models_failing_within_the_window_back_off_their_instance() -> None:
    coordinator, registry, _ = setup(FakeDriver(fail=True))
    coordinator.start("x", "a")
    await coordinator.wait("x")
    coordinator.start("x", "c")
    await coordinator.wait("x")
    snap = registry.snapshot()
    assert not snap.instance("x").available(snap.now)


async def test_nothing_is_evicted_for_a_model_that_cannot_load() -> None:
    driver = FakeDriver()
    driver.loadable = False
    coordinator, registry, _ = setup(driver)
    coordinator.start("x", "a", victims=("b",))
    assert await coordinator.wait("x") is False
    assert registry.snapshot().instance("x").state_of("b") is WarmState.WARM
    assert ("unload", "b") not in driver.calls
    assert ("load", "a:7b") not in driver.calls


async def test_a_swap_past_swap_timeout_fails_as_timeout() -> None:
    coordinator, _, metrics = setup(FakeDriver(delay=5), swap_timeout=0.05)
    coordinator.start("x", "a")
    assert await coordinator.wait("x") is False
    assert sample(metrics, "swapgate_swaps_total", instance="x", model="a", result="timeout") == 1


async def test_measured_swaps_feed_the_eta() -> None:
    coordinator, _, _ = setup(FakeDriver(delay=0.02))
    assert coordinator.times.eta("x", "a") == 30.0
    coordinator.start("x", "a")
    await coordinator.wait("x")
    assert 0.02 <= coordinator.times.eta("x", "a") < 1.0


def test_the_eta_is_the_median_of_the_last_five() -> None:
    times = SwapTimes(expected=30.0)
    for seconds in (100, 1, 2, 3, 50, 4):
        times.record("x", "a", seconds)
    assert times.eta("x", "a") == 3
    assert times.eta("x", "other") == 30.0


async def test_closing_cancels_a_running_swap() -> None:
    driver = FakeDriver(delay=10)
    coordinator, registry, _ = setup(driver)
    coordinator.start("x", "a")
    assert await eventually(lambda: bool(driver.calls)), "the load runs"
    await coordinator.aclose()
    assert registry.snapshot().instance("x").swapping is None


async def test_waiters_on_a_swap_protect_its_model_until_they_are_served() -> None:
    from swapgate.config.loading import parse_config as parse
    from swapgate.control.routing.router import Router
    from swapgate.policy.placement import Policy, Serve, Swap, place

    driver = FakeDriver(delay=0.05)
    settings = parse(
        {
            "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
            "routing": {"min_residency": 0},
        }
    )
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog)
    registry.polls.apply_report("x", InstanceReport({}, None), 0)
    coordinator = SwapCoordinator(registry, {"x": driver}, catalog, SwapTimes(1.0), Metrics(), 5.0)
    router = Router(settings, registry, coordinator, catalog, Metrics())
    policy = Policy(min_residency=0)
    seen: list[tuple[bool, object]] = []
    end_swap = registry.swap_marks.end_swap

    def ended(*args: Any, **kwargs: Any) -> None:
        # The moment the swap ends, before its waiter runs again: a is warm and idle, yet
        # its waiter has not been leased: b may not evict it.
        end_swap(*args, **kwargs)
        seen.append((waiter.done(), place("b", registry.snapshot(), policy)))

    registry.swap_marks.end_swap = ended  # type: ignore[method-assign]
    waiter = asyncio.create_task(router.acquire("a"))
    assert await eventually(lambda: registry.traffic.waiting_on("x", "a") == 1)
    await coordinator.wait("x")
    assert len(seen) == 1
    assert seen[0][0] is False
    assert seen[0][1] != Swap("x", ("a",))
    lease = await waiter
    assert lease.name == "x"
    assert registry.snapshot().instance("x").models["a"].waiting == 0
    router.release(lease)
    assert place("b", registry.snapshot(), policy) == Swap("x", ("a",))
    assert isinstance(place("a", registry.snapshot(), policy), Serve)


class SleepingDriver(FakeDriver):
    """vLLM's sleep mode as the coordinator sees it: evicted models sleep, and what is awake
    beyond the capacity is the coordinator's to put back to sleep; a sleep takes a moment."""

    evicts_to = WarmState.ASLEEP
    trims_to_capacity = True

    async def unload(self, model: str) -> None:
        await super().unload(model)
        await asyncio.sleep(0.05)
        if self.fail:
            raise DriverError("no answer")


def awake_both(driver: FakeDriver) -> tuple[SwapCoordinator, Registry, Metrics]:
    coordinator, registry, metrics = setup(driver)
    both = {"a:7b": WarmState.WARM, "b": WarmState.WARM}
    registry.polls.apply_report("x", InstanceReport(both, frozenset(both)), 0)
    registry.traffic.begin_request("x", "b")  # b served a request since: a is the less wanted
    registry.traffic.end_request("x", "b")
    return coordinator, registry, metrics


async def test_what_is_awake_beyond_capacity_is_put_to_sleep_and_takes_no_request_meanwhile() -> (
    None
):
    driver = SleepingDriver()
    coordinator, registry, _ = awake_both(driver)
    assert coordinator.reconcile("x", POLICY) is True
    assert coordinator.reconcile("x", POLICY) is False, "one at a time, in the swap slot"
    await asyncio.sleep(0.01)
    assert place("a", registry.snapshot(), POLICY) == Queue("x"), "a is leaving: not served"
    await coordinator.wait("x")
    view = registry.snapshot().instance("x")
    assert driver.calls == [("unload", "a:7b")]
    assert (view.state_of("a"), view.state_of("b")) == (WarmState.ASLEEP, WarmState.WARM)
    assert coordinator.reconcile("x", POLICY) is False, "within capacity: nothing to do"


async def test_a_sleep_that_fails_leaves_the_model_serving_and_the_next_poll_tries_again() -> None:
    driver = SleepingDriver(fail=True)
    coordinator, registry, _ = awake_both(driver)
    assert coordinator.reconcile("x", POLICY) is True
    await coordinator.wait("x")
    view = registry.snapshot().instance("x")
    assert view.state_of("a") is WarmState.WARM
    assert not view.models["a"].closing, "serving again"
    assert place("a", registry.snapshot(), POLICY) == Serve("x")
    assert coordinator.reconcile("x", POLICY) is True


async def test_engines_that_evict_by_themselves_are_never_trimmed() -> None:
    coordinator, _, _ = awake_both(FakeDriver())
    assert coordinator.reconcile("x", POLICY) is False


class CrashingDriver(FakeDriver):
    """A driver whose load breaks with something no driver should raise: a bug."""

    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        raise KeyError("a bug in a driver")


async def test_a_load_that_crashes_fails_its_swap_and_is_counted_as_ours() -> None:
    """Its waiters are told the swap failed (not left joining a load that never ends), the
    traceback is logged, and the fault counts in swapgate_internal_errors_total."""
    coordinator, registry, metrics = setup(CrashingDriver())
    coordinator.start("x", "a")
    assert await coordinator.wait("x") is False
    snap = registry.snapshot()
    view = snap.instance("x")
    assert (view.state_of("a"), view.swapping) == (WarmState.COLD, None)
    assert view.models["a"].failure == "swapgate failed loading it (KeyError)"
    assert sample(metrics, "swapgate_swaps_total", instance="x", model="a", result="failed") == 1
    assert sample(metrics, "swapgate_internal_errors_total", where="swap") == 1


async def test_the_first_load_is_told_without_a_made_up_time_left() -> None:
    coordinator, _, _ = setup(FakeDriver())
    coordinator.times.expected = None  # no expected_swap, and nothing measured yet
    assert coordinator.start("x", "a", ("b",))
    first = coordinator.progress.figure("x", "a")
    assert first is not None
    assert first.text.startswith("loading, "), first
    assert await coordinator.wait("x") is True
    assert coordinator.start("x", "b", ("a",))
    second = coordinator.progress.figure("x", "b")
    assert second is not None
    assert "loading" not in second.text, "a load was measured"
    await coordinator.wait("x")


SERVES_A = {"instances": [{"name": "x", "url": "http://x", "models": ["a"]}]}


async def test_a_recycle_lets_the_requests_in_flight_finish_then_restarts_the_model() -> None:
    """A process grown past recycle_rss: new requests wait for the restart, the one it serves
    finishes first; a restart is counted as a recycle, not as a swap."""
    w = world(SERVES_A)
    w.warm("x", "a")
    serving = await w.router.acquire("a")
    assert w.coordinator.recycle("x", "a") is True
    assert w.coordinator.recycle("x", "a") is False, "one flight per instance"
    assert w.state("x", "a") is WarmState.LOADING
    waiting = asyncio.create_task(w.router.acquire("a"))
    await asyncio.sleep(0.1)
    assert w.drivers["x"].calls == [], "nothing stops under a request it serves"
    assert not waiting.done()
    w.router.release(serving)
    assert await w.coordinator.wait("x") is True
    assert w.drivers["x"].calls == [("unload", "a"), ("load", "a")]
    lease = await asyncio.wait_for(waiting, 2)
    assert lease.name == "x"
    w.router.release(lease)
    assert w.state("x", "a") is WarmState.WARM
    assert w.sample("swapgate_process_recycles_total", instance="x", model="a") == 1
    assert w.sample("swapgate_swaps_total", instance="x", model="a", result="ok") is None


async def test_a_recycle_that_fails_to_start_again_backs_the_model_off() -> None:
    w = world(SERVES_A)
    w.warm("x", "a")
    w.drivers["x"].fail = True
    assert w.coordinator.recycle("x", "a") is True
    assert await w.coordinator.wait("x") is False
    snap = w.registry.snapshot()
    view = snap.instance("x")
    assert view.backing_off("a", snap.now)
    assert view.models["a"].failure == "boom"
    assert w.sample("swapgate_process_recycles_total", instance="x", model="a") is None
