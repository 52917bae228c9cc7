from __future__ import annotations

import asyncio
import time

import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.state.registry import Registry
from swapgate.data.demand import HISTORY, Arrivals
from swapgate.data.warm import InstanceReport, WarmState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(models: list[str] | None = None) -> tuple[Registry, Clock]:
    settings = parse_config(
        {
            "instances": [{"name": "x", "url": "http://x", "models": models}],
            "models": {"coder": {"upstream_names": {"x": "qwen:32b"}}},
        }
    )
    clock = Clock()
    return Registry(settings.instances, Catalog(settings), clock), clock


def report(
    running: dict[str, WarmState] | None,
    available: set[str] | None = None,
    unreachable: dict[str, str] | None = None,
) -> InstanceReport:
    known = frozenset(available) if available is not None else None
    return InstanceReport(running, known, unreachable=unreachable)


def state(registry: Registry, model: str) -> WarmState:
    return registry.snapshot().instance("x").state_of(model)


def test_a_poll_brings_the_instance_up_with_its_warm_models_renamed() -> None:
    registry, _ = make()
    assert not registry.up_names()
    registry.polls.apply_report("x", report({"qwen:32b": WarmState.WARM}, {"qwen:32b", "b"}), 0)
    assert list(registry.up_names()) == ["x"]
    assert registry.snapshot().instance("x").serves == {"coder", "b"}
    assert state(registry, "coder") is WarmState.WARM
    assert registry.known_models() == {"coder", "b"}


def test_configured_models_are_not_replaced_by_discovery() -> None:
    registry, _ = make(models=["a"])
    registry.polls.apply_report("x", report({}, {"a", "b"}), 0)
    assert registry.snapshot().instance("x").serves == {"a"}


def test_a_model_swapped_out_by_hand_is_seen_cold() -> None:
    registry, _ = make()
    registry.polls.apply_report("x", report({"a": WarmState.WARM}), 0)
    registry.polls.apply_report("x", report({"b": WarmState.LOADING}), 0)
    assert state(registry, "a") is WarmState.COLD
    assert state(registry, "b") is WarmState.LOADING


def test_a_poll_sent_before_a_swap_changed_things_does_not_undo_it() -> None:
    registry, _ = make()
    registry.polls.apply_report("x", report({}), 0)
    stale = registry.generation("x")
    registry.swap_marks.begin_swap("x", "a", eta=5)
    registry.swap_marks.end_swap("x", "a", ok=True)
    registry.polls.apply_report("x", report({}), stale)  # answered before the swap finished
    assert state(registry, "a") is WarmState.WARM
    registry.polls.apply_report("x", report({}), registry.generation("x"))
    assert state(registry, "a") is WarmState.COLD


def test_a_failed_swap_keeps_the_model_from_loading_there_not_the_instance() -> None:
    registry, clock = make()
    registry.polls.apply_report("x", report({}), 0)
    registry.swap_marks.begin_swap("x", "a", eta=1)
    registry.swap_marks.end_swap("x", "a", ok=False, backoff=5, failure="a exited with SIGSEGV")
    view = registry.snapshot().instance("x")
    assert view.models["a"].backoff_until - clock.now == 5
    assert view.models["a"].failure == "a exited with SIGSEGV"
    assert view.backing_off("a", clock.now)
    assert view.available(clock.now)  # its other models still serve and load
    clock.now += 5
    assert not registry.snapshot().instance("x").backing_off("a", clock.now)


def test_a_failed_swap_with_a_whole_backoff_keeps_the_instance_out() -> None:
    registry, clock = make()
    registry.polls.apply_report("x", report({}), 0)
    registry.swap_marks.begin_swap("x", "a", eta=1)
    registry.swap_marks.end_swap("x", "a", ok=False, backoff=5, whole=10)
    assert registry.snapshot().instance("x").backoff_until - clock.now == 10
    assert not registry.snapshot().instance("x").available(clock.now)


def test_a_model_whose_server_does_not_answer_is_down_alone_until_it_answers() -> None:
    registry, clock = make()
    why = "its vLLM server 127.0.0.1:9 does not answer"
    registry.polls.apply_report("x", report({"a": WarmState.WARM}, unreachable={"b": why}), 0)
    view = registry.snapshot().instance("x")
    assert not view.reachable("b")
    assert view.models["b"].down == why
    assert view.reachable("a")
    registry.swap_marks.begin_swap("x", "b", eta=1)
    registry.swap_marks.end_swap(
        "x", "b", ok=False, backoff=60, failure="POST /wake_up: ConnectError"
    )
    # back, awake: reconciled by the next poll, and its backoff lifted at once
    back = report({"a": WarmState.WARM, "b": WarmState.WARM})
    registry.polls.apply_report("x", back, registry.generation("x"))
    view = registry.snapshot().instance("x")
    assert view.reachable("b")
    assert not view.backing_off("b", clock.now)
    assert view.state_of("b") is WarmState.WARM


def test_requests_are_counted_and_mark_use() -> None:
    registry, clock = make()
    registry.traffic.begin_request("x", "a")
    clock.now = 130.0
    view = registry.snapshot().instance("x")
    assert (view.inflight, view.models["a"].inflight, view.models["a"].last_used) == (1, 1, 100.0)
    registry.traffic.end_request("x", "a")
    view = registry.snapshot().instance("x")
    assert (view.inflight, view.models["a"].last_used) == (0, 130.0)


async def test_waiters_wake_on_a_change_and_time_out_without_one() -> None:
    registry, _ = make()
    waiter = asyncio.create_task(registry.changes.wait(5))
    await asyncio.sleep(0)  # it waits
    assert not waiter.done()
    registry.swap_marks.begin_swap("x", "a", eta=1)
    await asyncio.wait_for(waiter, 1)  # woken long before its 5 s
    assert waiter.done()
    started = time.monotonic()
    await registry.changes.wait(0.05)  # nothing changes: returns at the timeout
    assert 0.04 <= time.monotonic() - started < 1


def test_queue_depths_only_list_waiting_models() -> None:
    registry, _ = make()
    assert registry.queues.enter("a", 10.0) == 1
    assert registry.queues.enter("a", 12.0) == 2
    assert registry.queues.depths() == {"a": 2}
    registry.queues.leave("a", 10.0)
    registry.queues.leave("a", 12.0)
    assert registry.queues.depths() == {}


def test_the_snapshot_knows_each_queue_s_oldest_request() -> None:
    registry, _ = make()
    registry.queues.enter("a", 12.0)
    registry.queues.enter("a", 10.0)
    registry.queues.enter("b", 11.0)
    assert registry.snapshot().queued == {"a": 10.0, "b": 11.0}
    registry.queues.leave("a", 10.0)  # the oldest is served: the next one is the oldest now
    assert registry.snapshot().queued == {"a": 12.0, "b": 11.0}


def test_arrivals_keep_the_latest_gaps_per_model() -> None:
    registry, clock = make()
    for _ in range(HISTORY + 10):
        registry.queues.arrived("a")
        clock.now += 2.0
    registry.queues.arrived("b")
    arrivals = registry.snapshot().arrivals
    assert arrivals["a"].last == clock.now - 2.0
    assert arrivals["a"].gaps == (2.0,) * HISTORY  # the oldest gaps are forgotten
    assert arrivals["b"] == Arrivals(clock.now)  # one request: no gap yet
    assert "c" not in arrivals


@pytest.mark.parametrize(
    ("why", "arrivals", "idle", "chance"),
    [
        # all nine gaps ended within the horizon, and the assumed one with chance 30 / (5 + 30)
        ("steady, a request every 10 s", Arrivals(0, (10,) * 9), 5, (9 + 30 / 35) / 10),
        # the bursts' short gaps are all shorter than the idle time; one gap in four ended
        # within the horizon, and the assumed gap with chance 30 / (20 + 30)
        ("a burst is over", Arrivals(0, (1, 2, 1, 100, 2, 1, 200, 40, 300)), 20, 1.6 / 5),
        ("no history: idle for a while, likely idle as long again", Arrivals(0), 90, 0.25),
        ("just requested, no history: likely back", Arrivals(0), 0, 1.0),
    ],
)
def test_the_chance_of_another_request_within_the_horizon(
    why: str, arrivals: Arrivals, idle: float, chance: float
) -> None:
    assert arrivals.chance_within(now=idle, horizon=30) == pytest.approx(chance)


def test_closing_reserves_the_room_for_the_starving_model_until_a_swap_begins() -> None:
    registry, clock = make(models=["a", "b"])
    registry.polls.apply_report("x", report({"b": WarmState.WARM}), 0)
    registry.swap_marks.reserve("x", ("b",), clock.now + 30, room_for="a")
    assert registry.snapshot().instance("x").reserved_for == "a"
    clock.now += 31  # the reservation lapses with the closing
    assert registry.snapshot().instance("x").reserved_for is None
    registry.swap_marks.reserve("x", ("b",), clock.now + 30, room_for="a")
    registry.swap_marks.begin_swap("x", "a", eta=1)
    assert registry.snapshot().instance("x").reserved_for is None


def test_unreserving_gives_the_room_back_unless_the_swap_took_it() -> None:
    registry, clock = make(models=["a", "b", "c"])
    registry.polls.apply_report("x", report({"b": WarmState.WARM}), 0)
    registry.swap_marks.reserve("x", ("b",), clock.now + 30, room_for="a")
    registry.swap_marks.unreserve("x", "c")  # not the model the room was made for: nothing changes
    assert registry.snapshot().instance("x").models["b"].closing
    registry.swap_marks.unreserve(
        "x", "a"
    )  # a's request went elsewhere, or gave up: b serves again
    view = registry.snapshot().instance("x")
    assert view.reserved_for is None
    assert not view.models["b"].closing
    registry.swap_marks.reserve("x", ("b",), clock.now + 30, room_for="a")
    registry.swap_marks.begin_swap(
        "x", "a", eta=1
    )  # the swap took the room: later unreserve is a no-op
    registry.swap_marks.reserve("x", ("c",), clock.now + 30, room_for="c")
    registry.swap_marks.unreserve("x", "a")
    assert registry.snapshot().instance("x").reserved_for == "c"


@pytest.mark.parametrize("all_warm", [True])
def test_fixed_model_servers_are_all_warm(all_warm: bool) -> None:
    registry, _ = make(models=["a", "b"])
    registry.polls.apply_report("x", InstanceReport(None, None, all_warm=all_warm), 0)
    assert state(registry, "a") is WarmState.WARM
    assert state(registry, "b") is WarmState.WARM


def test_a_size_the_backend_reports_replaces_the_estimate_where_memory_counts() -> None:
    settings = parse_config(
        {
            "instances": [
                {"name": "gpu", "url": "http://x", "memory": "24GiB", "models": ["qwen", "llama"]}
            ],
            "models": {
                "qwen": {"memory": "10GiB", "upstream_names": {"gpu": "qwen2.5:7b"}},
                "llama": {"memory": "12GiB"},
            },
        }
    )
    registry = Registry(settings.instances, Catalog(settings))
    before = registry.snapshot().instance("gpu")
    assert (before.memory, before.sizes["qwen"]) == (24 * 2**30, 10 * 2**30)
    report = InstanceReport({"qwen2.5:7b": WarmState.WARM}, None, sizes={"qwen2.5:7b": 6 * 2**30})
    registry.polls.apply_report("gpu", report, registry.generation("gpu"))
    after = registry.snapshot().instance("gpu")
    assert after.sizes == {"qwen": 6 * 2**30, "llama": 12 * 2**30}, "learned, by client name"
    assert after.used == 6 * 2**30
    assert registry.sizes("gpu") == {
        "qwen": {"estimate": 10 * 2**30, "learned": 6 * 2**30, "placed_by": 6 * 2**30},
        "llama": {"estimate": 12 * 2**30, "placed_by": 12 * 2**30},
    }


def test_the_waitlist_serves_by_class_then_arrival() -> None:
    from swapgate.control.state.queues import Queues

    waitlist = Queues(lambda: 0.0)
    waitlist.enter("m", 1.0, 0)
    waitlist.enter("m", 2.0, -10)
    waitlist.enter("m", 3.0, 10)
    assert waitlist.ahead("m", 10, 3.0) == 0, "the interactive one, though it came last"
    assert waitlist.ahead("m", 0, 1.0) == 1
    assert waitlist.ahead("m", -10, 2.0) == 2
    assert waitlist.ahead("m", 0, 4.0) == 2, "a newcomer of the default class"
    assert (waitlist.oldest(), waitlist.classes(), waitlist.depths()) == (
        {"m": 1.0},
        {"m": 10},
        {"m": 3},
    )
    waitlist.leave("m", 3.0, 10)
    assert waitlist.classes() == {"m": 0}


def test_a_queued_request_of_another_pool_does_not_hold_back_a_slot_it_cannot_use() -> None:
    from swapgate.control.state.queues import Queues

    waitlist = Queues(lambda: 0.0)
    waitlist.enter("m", 1.0, 0, ("x",))  # may use instance x only
    waitlist.enter("m", 2.0, 0, ())  # any instance
    assert waitlist.ahead("m", 0, 3.0, ("y",)) == 1, "only the one that may use y too"
    assert waitlist.ahead("m", 0, 3.0, ("x", "y")) == 2
    assert waitlist.ahead("m", 0, 3.0) == 2, "a request of any instance: everyone ahead"
    waitlist.leave("m", 1.0, 0, ("x",))
    assert waitlist.depths() == {"m": 1}


def test_a_429_teaches_the_instances_limit_for_a_while_and_it_only_goes_down() -> None:
    registry, clock = make()
    registry.polls.apply_report("x", report({"a": WarmState.WARM}), 0)
    for _ in range(3):
        registry.traffic.begin_request("x", "a")
    assert registry.traffic.limited("x", "a", keep=60) == 2  # two others in flight with the refused
    assert registry.snapshot().instance("x").models["a"].limit == 2
    registry.traffic.end_request("x", "a")
    registry.traffic.limited("x", "a", keep=60)  # refused again with one other in flight
    assert registry.snapshot().instance("x").models["a"].limit == 1
    registry.traffic.end_request("x", "a")
    registry.traffic.limited("x", "a", keep=60)  # none in flight but it: still one at a time
    assert registry.snapshot().instance("x").models["a"].limit == 1
    clock.now += 61
    assert registry.snapshot().instance("x").models["a"].limit is None, "tried higher again"
