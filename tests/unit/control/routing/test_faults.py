"""A fleet when parts break, in-process (docs/operations.md, "When part of the fleet breaks"): a
model that cannot load is tried a bounded number of times and then answered at once, one probe
at a time; a refused connection places the request again; a hung instance's waits end when it
is declared down; a flapping instance is held out. The real registry, router and coordinator,
fake drivers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swapgate.control.faults.hangups import Hangups
from swapgate.control.routing.failover import Attempts
from swapgate.data.lease import Progress
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.errors import DriverError, DriverUnreachable, InstanceDown, ModelFailing, SwapFailed
from swapgate.policy import backoff
from swapgate.policy.retry import Failure, Next
from tests.unit.fakes import FakeClock, FakeDriver, World, eventually, recheck_at_once, world


class BrokenModel(FakeDriver):
    """Loads ``broken`` fail with the engine's words (``why``); the others load."""

    def __init__(self, broken: str = "bad", why: str = "exit status 1: invalid magic") -> None:
        super().__init__(delay=0.01)
        self.broken, self.why = broken, why

    async def load(self, model: str) -> None:
        await super().load(model)
        if model == self.broken:
            raise DriverError(f"GET /upstream/{model}/health answered 502: {self.why}")


class Unreachable(FakeDriver):
    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        raise DriverUnreachable("GET /upstream: ConnectError: connection refused")


def fleet(count: int = 3, capacity: int = 1, **routing: Any) -> dict[str, Any]:
    return {
        "instances": [
            {"name": f"i{n}", "url": f"http://i{n}", "models": ["bad", "ok", "other"]}
            | {"capacity": capacity}
            for n in range(count)
        ],
        "routing": {"min_residency": 0, **routing},
    }


def loads(w: World, model: str) -> int:
    return sum(call == ("load", model) for d in w.drivers.values() for call in d.calls)


def up(w: World, *warm: tuple[str, str]) -> None:
    for name in w.registry.names():
        w.warm(name, *(m for i, m in warm if i == name))


def broken(monkeypatch: pytest.MonkeyPatch, count: int = 3) -> tuple[World, FakeClock]:
    """``count`` instances up whose loads of "bad" fail, on a fake clock the waiters follow."""
    recheck_at_once(monkeypatch)
    clock = FakeClock()
    w = world(fleet(count=count), clock=clock, driver=BrokenModel)
    return w, clock


async def test_a_model_that_cannot_load_costs_two_loads_then_is_answered_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, _ = broken(monkeypatch)
    up(w)
    with pytest.raises(ModelFailing) as first:
        await w.router.acquire("bad")
    assert loads(w, "bad") == 2, "two attempts, on two instances"
    tried = {name for name, d in w.drivers.items() if ("load", "bad") in d.calls}
    assert len(tried) == 2
    assert "invalid magic" in first.value.message
    assert first.value.code == "model_failing"
    assert first.value.status == 503
    assert w.registry.failing.of("bad") is not None
    # Every request now: at once, no load, with the time to the next try
    for _ in range(10):
        with pytest.raises(ModelFailing) as again:
            await w.router.acquire("bad")
        assert again.value.retry_after == backoff.PROBE_FIRST
    assert loads(w, "bad") == 2
    # Healthy models are served meanwhile
    lease = await w.router.acquire("ok")
    w.router.release(lease)


async def test_one_probe_at_a_time_after_a_growing_delay_and_one_success_clears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, clock = broken(monkeypatch)
    up(w)
    with pytest.raises(ModelFailing):
        await w.router.acquire("bad")
    clock.advance(backoff.PROBE_FIRST + 0.1)
    # A burst when the probe is due: one load, its requests share it
    burst = await asyncio.gather(
        *(w.router.acquire("bad") for _ in range(6)), return_exceptions=True
    )
    assert all(isinstance(e, ModelFailing) for e in burst), burst
    assert loads(w, "bad") == 3
    failing = w.registry.failing.of("bad")
    assert failing is not None
    assert failing.failed_probes == 1
    assert failing.next_probe - clock() == pytest.approx(2 * backoff.PROBE_FIRST)
    # The engine is mended: the next probe loads it, and it serves from then on
    for driver in w.drivers.values():
        assert isinstance(driver, BrokenModel)
        driver.broken = ""
    clock.advance(2 * backoff.PROBE_FIRST + 0.1)
    lease = await w.router.acquire("bad")
    w.router.release(lease)
    assert w.registry.failing.of("bad") is None
    assert loads(w, "bad") == 4


async def test_no_healthy_model_is_evicted_for_a_failing_one_while_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, clock = broken(monkeypatch, count=2)
    up(w, ("i0", "ok"), ("i1", "other"))
    with pytest.raises(ModelFailing):
        await w.router.acquire("bad")
    evicted = sum(c[0] == "unload" for d in w.drivers.values() for c in d.calls)
    assert evicted <= 2
    # Both healthy models reloaded and in use: the probe finds no room and evicts nothing
    held = [await w.router.acquire("ok"), await w.router.acquire("other")]
    before = [list(d.calls) for d in w.drivers.values()]
    clock.advance(backoff.PROBE_FIRST + 0.1)
    with pytest.raises(ModelFailing):
        await asyncio.wait_for(w.router.acquire("bad"), 5)
    assert [list(d.calls) for d in w.drivers.values()] == before
    for lease in held:
        w.router.release(lease)


async def test_failures_of_the_instance_do_not_make_the_model_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recheck_at_once(monkeypatch)
    w = world(fleet(), driver=Unreachable)
    up(w)
    with pytest.raises(SwapFailed) as answer:
        await w.router.acquire("ok")
    assert not isinstance(answer.value, ModelFailing)
    assert loads(w, "ok") == backoff.ATTEMPTS
    assert answer.value.message.count("connection refused") == 2, "each attempt's error"
    assert w.registry.failing.of("ok") is None


async def test_a_refused_connection_places_the_request_again_as_a_cold_one() -> None:
    w = world(fleet(count=2))
    up(w, ("i0", "ok"))
    attempts = Attempts(w.router, "ok")
    first = await attempts.first(Progress())
    assert first.name == "i0"
    w.registry.polls.refused("i0")  # as the data plane does when its connection is refused
    assert attempts.after(Failure.REFUSED, 0.0, True) is Next.PLACE
    second = await attempts.place_again(Progress())
    assert second.name == "i1"
    assert ("load", "ok") in w.drivers["i1"].calls
    assert not w.registry.is_up("i0")
    assert w.state("i0", "ok") is WarmState.COLD, "its warm models count nowhere"
    assert attempts.after(Failure.REFUSED, 0.0, True) is None, "placed again once"
    attempts.release()
    assert all(i.inflight == 0 for i in w.registry.snapshot().instances)


async def test_a_request_waiting_on_an_instance_declared_down_ends_naming_it() -> None:
    hangups = Hangups()
    held = asyncio.Event()

    async def waiting(instance: str) -> str:
        with hangups.watch(instance):
            held.set()
            await asyncio.sleep(30)
        return "answered"

    hung = asyncio.create_task(waiting("i3"))
    other = asyncio.create_task(waiting("i4"))
    await held.wait()
    await asyncio.sleep(0)
    assert hangups.cut("i3") == 1
    with pytest.raises(InstanceDown, match="i3"):
        await hung
    assert not other.done()
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other  # a cancellation of its own stays one


async def test_marking_an_instance_down_ends_what_waits_on_it() -> None:
    w = world(fleet(count=2))
    up(w, ("i0", "ok"))

    async def waiting() -> None:
        with w.registry.hangups.watch("i0"):
            await asyncio.sleep(30)

    task = asyncio.create_task(waiting())
    assert await eventually(lambda: bool(w.registry.hangups._waiting.get("i0")))
    w.registry.polls.mark_down("i0")
    with pytest.raises(InstanceDown):
        await task


def test_an_instance_that_flaps_is_held_out_for_a_growing_while() -> None:
    clock = FakeClock()
    w = world(fleet(count=2), clock=clock)
    up(w)
    holds = []
    for _ in range(4):
        w.registry.polls.mark_down("i0")
        clock.advance(1)
        w.warm("i0")
        view = w.registry.snapshot().instance("i0")
        holds.append(max(0, round(view.backoff_until - clock())))
        clock.advance(1)
    assert holds == [0, 10, 20, 40]
    assert not w.registry.snapshot().instance("i0").available(clock())


@pytest.mark.parametrize(
    ("failures", "expected"),
    [
        ([("i0", 0.0, "e1", "model")], False),
        ([("i0", 0.0, "e1", "model"), ("i1", 1.0, "e2", "model")], True),
        ([("i0", 0.0, "e1", "model"), ("i0", 1.0, "e1", "model")], True),
        ([("i0", 0.0, "e1", "model"), ("i0", 1.0, "e2", "model")], False),
        ([("i0", 0.0, "e1", "model"), ("i1", 61.0, "e1", "model")], False),
        ([("i0", 0.0, "e1", "instance"), ("i1", 1.0, "e1", "model")], False),
    ],
)
def test_when_a_model_is_failing(failures: list[Any], expected: bool) -> None:
    record = [backoff.LoadFailure(*f) for f in failures]
    assert backoff.failing(record, 60.0) is expected


@pytest.mark.parametrize(
    ("error", "unreachable", "timed_out", "others", "blame"),
    [
        ("exit status 1", False, False, False, "model"),
        ("ConnectError", True, False, False, "instance"),
        ("", False, True, False, "instance"),
        ("CUDA error: out of memory", False, False, True, "instance"),
        ("CUDA error: out of memory", False, False, False, "model"),
    ],
)
def test_whose_fault_a_failed_load_is(
    error: str, unreachable: bool, timed_out: bool, others: bool, blame: str
) -> None:
    found = backoff.blame(
        error, unreachable=unreachable, timed_out=timed_out, others_resident=others
    )
    assert found == blame


def test_probe_delays_double_to_a_bound() -> None:
    delays = [backoff.probe_delay(n) for n in range(8)]
    assert delays[:3] == [10.0, 20.0, 40.0]
    assert max(delays) == backoff.PROBE_MOST


def test_a_poll_answer_of_a_down_instance_brings_it_back() -> None:
    w = world(fleet(count=1))
    w.registry.polls.mark_down("i0")
    report = InstanceReport({"ok": WarmState.WARM}, None)
    w.registry.polls.apply_report("i0", report, w.registry.generation("i0"))
    assert w.registry.is_up("i0")
