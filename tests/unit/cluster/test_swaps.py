"""A replica among others, in-process: its claims, the others' events, pins and heartbeats.

The Redis side is a fake here; tests/e2e/test_cluster.py runs the real one.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from swapgate.cluster import swaps as cluster_swaps
from swapgate.cluster.locks import Holder
from swapgate.cluster.messages import Event, Heard, decode, encode
from swapgate.cluster.store import Listener
from swapgate.cluster.swaps import OperatorShares, SharedClaims
from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.loops.scheduler import PreloadScheduler
from swapgate.control.state.peer_load import REPLICA_TTL
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.metrics import Metrics
from swapgate.policy.placement import Policy
from swapgate.tools.admin_cli import render_cluster
from tests.unit.fakes import FakeDriver, eventually


class FakeReplicas:
    """Records what the replica tells the others; ``taken`` says who holds which instance."""

    replica = "here"

    def __init__(self) -> None:
        self.taken: dict[str, Holder] = {}
        self.published: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, str]] = {"pins": {}, "drains": {}}
        self.released: list[str] = []
        self.down = False
        self.leading = True
        self.locks = self  # claim, release and holder are its own

    async def start(self, listener: Listener) -> None: ...
    async def aclose(self) -> None: ...

    async def claim(self, instance: str, model: str) -> Holder | None:
        return self.taken.get(instance) or self.taken.get(model)

    async def release(self, instance: str) -> None:
        self.released.append(instance)

    async def holder(self, instance: str) -> Holder | bool | None:
        return self.taken.get(instance)

    async def publish(self, event: Event) -> bool:
        """Records the event as it goes on the wire (without the sender)."""
        if self.down:
            return False
        wire = json.loads(encode(event, "here"))
        self.published.append({k: v for k, v in wire.items() if k != "r"})
        return True

    async def share(self, key: str, field: str, value: str | None) -> bool:
        if self.down:
            return False
        if value is None:
            self.stored[key].pop(field, None)
        else:
            self.stored[key][field] = value
        return True

    async def shared(self, key: str) -> dict[str, str]:
        return dict(self.stored[key])

    async def leads(self) -> bool:
        return self.leading


def heard(wire: dict[str, Any]) -> Heard:
    """An event as another replica's message brings it."""
    event = decode(json.dumps(wire))
    assert event is not None, wire
    return event


class Replica(SwapCoordinator):
    """A replica's coordinator with its claims, as the runtime wires them: what it says of
    itself, and what it hears (``apply``)."""

    def __init__(self, *parts: Any, claims: SharedClaims) -> None:
        super().__init__(*parts, claims=claims)
        self.shared = claims
        self.apply, self.resync = claims.apply, claims.resync

    async def connect(self) -> None:
        await self.shared.connect()

    async def aclose(self) -> None:
        await super().aclose()
        await self.shared.aclose()


def replica(delay: float = 0.02) -> tuple[Replica, Registry, FakeReplicas, FakeDriver]:
    settings = parse_config(
        {"instances": [{"name": "gpu-1", "url": "http://a"}, {"name": "gpu-2", "url": "http://b"}]}
    )
    catalog = Catalog(settings)
    fake = FakeReplicas()
    shares = OperatorShares(fake, time.monotonic)
    registry = Registry(settings.instances, catalog, time.monotonic, shares=shares)
    driver = FakeDriver(delay)
    times = SwapTimes(30.0)
    claims = SharedClaims(registry, times, fake, shares)
    drivers = {"gpu-1": driver, "gpu-2": driver}
    swaps = Replica(registry, drivers, catalog, times, Metrics(), 5.0, claims=claims)
    return swaps, registry, fake, driver


def state(registry: Registry, instance: str, model: str) -> str:
    view = registry.snapshot().instance(instance).models.get(model)
    return str(view.state) if view else "cold"


async def test_a_claimed_swap_runs_here_and_tells_the_others_how_it_ended() -> None:
    swaps, _registry, fake, driver = replica()
    assert swaps.start("gpu-1", "x")
    assert await swaps.wait("gpu-1")
    assert driver.calls == [("load", "x")]
    kinds = [e["t"] for e in fake.published]
    assert kinds == ["swap", "done"]
    done = fake.published[-1]
    assert (done["i"], done["m"], done["ok"]) == ("gpu-1", "x", True)
    assert done["s"] > 0
    assert fake.released == ["gpu-1"]


async def test_a_swap_another_replica_holds_is_joined_not_repeated() -> None:
    swaps, registry, fake, driver = replica()
    fake.taken["gpu-1"] = Holder("r2", "gpu-1", "x")
    swaps.start("gpu-1", "x")
    assert not await swaps.wait("gpu-1")  # its task ends at the claim
    assert driver.calls == [], "no second load"
    assert registry.swapping("gpu-1") == "x", "its waiters here wait for r2's swap"
    swaps.apply(heard({"t": "done", "i": "gpu-1", "m": "x", "ok": True, "s": 12.0, "r": "r2"}))
    assert state(registry, "gpu-1", "x") == "warm"
    assert registry.swapping("gpu-1") is None
    assert swaps.times.eta("gpu-1", "x") == 12.0, "r2's measured time feeds the ETA here"


async def test_a_model_loading_elsewhere_moves_the_waiters_to_that_instance() -> None:
    swaps, registry, fake, driver = replica()
    fake.taken["x"] = Holder("r2", "gpu-2", "x")  # r2 loads x on the other instance
    swaps.start("gpu-1", "x")
    assert not await swaps.wait("gpu-1")  # its task ends at the claim
    assert driver.calls == []
    assert registry.swapping("gpu-1") is None
    assert registry.swapping("gpu-2") == "x"


async def test_a_swap_whose_holder_died_is_given_up_so_waiters_place_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_swaps, "RECHECK", 0.02)
    swaps, registry, fake, _ = replica()
    await swaps.connect()
    swaps.apply(heard({"t": "swap", "i": "gpu-1", "m": "x", "eta": 20.0, "r": "r2"}))
    fake.taken["gpu-1"] = Holder("r2", "gpu-1", "x")
    gone = lambda: registry.swapping("gpu-1") is None  # noqa: E731
    assert not await eventually(gone, within=0.1), "held (five rechecks): still loading"
    del fake.taken["gpu-1"]  # r2 died; its lock expired
    assert await eventually(gone)
    assert state(registry, "gpu-1", "x") == "cold"
    await swaps.aclose()


async def test_evictions_and_drains_from_others_apply_and_are_not_echoed() -> None:
    swaps, registry, fake, _ = replica()
    registry.swap_marks.warmed("gpu-1", "x")
    swaps.apply(heard({"t": "evict", "i": "gpu-1", "m": "x", "r": "r2"}))
    swaps.apply(heard({"t": "drain", "i": "gpu-2", "on": True, "r": "r2"}))
    swaps.apply(heard({"t": "swap", "i": "gpu-9", "m": "x", "r": "r2"}))  # not in this config
    await asyncio.sleep(0)
    assert state(registry, "gpu-1", "x") == "cold"
    assert registry.snapshot().instance("gpu-2").drained
    assert fake.published == []


async def test_pins_set_here_are_shared_and_read_back_after_redis_returns() -> None:
    _swaps, registry, fake, _ = replica()
    registry.operator.pin("gpu-1", "x", time.monotonic() + 60)
    registry.operator.set_drained("gpu-2", True)
    await asyncio.sleep(0)
    assert [e["t"] for e in fake.published] == ["pin", "drain"]
    until = float(fake.stored["pins"]["gpu-1\tx"])
    assert time.time() + 55 < until < time.time() + 65, "kept as wall time"
    other, theirs, fake_two, _ = replica()
    fake_two.stored = fake.stored  # the same Redis
    await other.resync()
    view = theirs.snapshot().instance("gpu-1").models["x"]
    assert view.pinned_until > time.monotonic() + 55
    assert theirs.snapshot().instance("gpu-2").drained
    assert fake_two.published == [], "read back, not told again"


def test_in_flight_requests_elsewhere_count_until_their_replica_goes_quiet() -> None:
    _swaps, registry, _, _ = replica()
    registry.swap_marks.warmed("gpu-1", "x")
    now = time.monotonic()
    registry.peer_load.heard("r2", {"gpu-1": {"x": 3}}, now)
    registry.peer_load.heard("r3", {"gpu-1": {"x": 1}}, now)
    view = registry.snapshot().instance("gpu-1")
    assert (view.inflight, view.models["x"].inflight) == (4, 4)
    registry.peer_load.heard("r3", {}, now + REPLICA_TTL + 1)  # r2 has been quiet since
    assert registry.snapshot().instance("gpu-1").inflight == 0
    registry.traffic.begin_request("gpu-1", "x")
    assert registry.in_flight() == {"gpu-1": {"x": 1}}


async def test_scheduled_runs_happen_only_on_the_replica_that_leads() -> None:
    runs: list[str] = []
    leading = [False]

    async def leads() -> bool:
        return leading[0]

    scheduler = PreloadScheduler(lambda: None, Metrics(), leads)  # type: ignore[arg-type,return-value]

    async def run(name: str) -> Any:
        runs.append(name)

    scheduler.run = run  # type: ignore[method-assign]
    await scheduler._scheduled("warm")
    leading[0] = True
    await scheduler._scheduled("warm")
    assert runs == ["warm"]


def test_status_names_each_replica_and_what_it_holds() -> None:
    now = time.time()
    text = render_cluster(
        {
            "replica": "r1",
            "redis_up": True,
            "scheduler": "r1",
            "replicas": [
                {"id": "r1", "last_heartbeat": now},
                {"id": "r2", "last_heartbeat": now - 2},
            ],
            "swap_locks": {"gpu-2": {"replica": "r2", "model": "llama"}},
        }
    )
    lines = text.splitlines()
    assert lines[0] == "redis: up"
    assert lines[2].startswith("r1 (this one)")
    assert lines[2].endswith("scheduler")
    assert lines[3].startswith("r2")
    assert "2.0s ago" in lines[3]
    assert lines[3].endswith("swap lock gpu-2 (llama)")


async def test_a_drain_set_while_redis_is_down_is_told_once_it_answers() -> None:
    swaps, registry, fake, _ = replica()
    fake.down = True
    registry.operator.set_drained("gpu-1", True)
    await asyncio.sleep(0)
    assert fake.published == []
    assert fake.stored["drains"] == {}
    fake.down = False
    await swaps.resync()
    assert fake.stored["drains"] == {"gpu-1": "1"}
    assert fake.published == [{"t": "drain", "i": "gpu-1", "on": True}]
    assert registry.snapshot().instance("gpu-1").drained, "and read back as it stands"


@pytest.mark.parametrize("leading", [True, False])
async def test_only_the_leading_replica_puts_what_is_over_capacity_to_sleep(leading: bool) -> None:
    swaps, registry, fake, driver = replica()
    driver.trims_to_capacity = True
    fake.leading = leading
    registry.polls.apply_report(
        "gpu-1", InstanceReport({"x": WarmState.WARM, "y": WarmState.WARM}, None), 0
    )
    assert swaps.reconcile("gpu-1", Policy(min_residency=0.0))
    await swaps.wait("gpu-1")
    assert driver.calls == ([("unload", "x")] if leading else [])
    evictions = [e for e in fake.published if e["t"] == "evict"]
    assert len(evictions) == (1 if leading else 0), "the others learn of it"


async def test_a_mark_whose_instance_another_swap_holds_now_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mark of a swap that ended unheard (its claim met the lock as it was released) goes
    once another swap holds that instance: its waiters do not wait for it until max_wait."""
    monkeypatch.setattr(cluster_swaps, "RECHECK", 0.02)
    swaps, registry, fake, _ = replica()
    await swaps.connect()
    swaps.apply(heard({"t": "swap", "i": "gpu-1", "m": "x", "eta": 20.0, "r": "r2"}))
    fake.taken["gpu-1"] = Holder("r2", "gpu-1", "y")  # x's swap ended; y's runs there now
    assert await eventually(lambda: registry.swapping("gpu-1") is None)
    assert state(registry, "gpu-1", "x") == "cold"
    swaps.apply(heard({"t": "swap", "i": "gpu-2", "m": "x", "eta": 20.0, "r": "r2"}))
    # A done of another model on the marked instance ends the mark too
    swaps.apply(heard({"t": "done", "i": "gpu-2", "m": "y", "ok": True, "s": 1.0, "r": "r2"}))
    assert registry.swapping("gpu-2") is None
    assert state(registry, "gpu-2", "x") == "cold"
    assert state(registry, "gpu-2", "y") == "warm"
    await swaps.aclose()


async def test_a_swap_gives_its_locks_back_before_it_tells_how_it_ended() -> None:
    swaps, _registry, fake, _ = replica()
    order: list[str] = []
    release, publish = fake.release, fake.publish

    async def releasing(instance: str) -> None:
        order.append("release")
        await release(instance)

    async def publishing(event: Event) -> bool:
        order.append(type(event).__name__)
        return await publish(event)

    fake.release, fake.publish = releasing, publishing  # type: ignore[method-assign]
    assert swaps.start("gpu-1", "x")
    assert await swaps.wait("gpu-1")
    assert order == ["SwapStarted", "release", "SwapDone"]


async def test_failed_loads_heard_from_others_count_towards_failing() -> None:
    _swaps, registry, _fake, _ = replica()
    said = "exit status 1: bad magic"
    for instance in ("gpu-1", "gpu-2"):
        done = {"t": "done", "i": instance, "m": "x", "ok": False, "s": 0.0, "b": 5.0}
        _swaps.apply(heard({**done, "e": said, "bl": "model", "r": "r2"}))
    failing = registry.failing.of("x")
    assert failing is not None
    assert said in failing.error
    _swaps.apply(heard({"t": "done", "i": "gpu-1", "m": "x", "ok": True, "s": 1.0, "r": "r2"}))
    assert registry.failing.of("x") is None, "one load that worked clears it"


async def test_an_instance_refused_here_is_down_on_the_others_too() -> None:
    swaps, registry, fake, _ = replica()
    registry.polls.apply_report("gpu-1", InstanceReport({"x": WarmState.WARM}, None), 0)
    registry.polls.refused("gpu-1")
    assert await eventually(lambda: {"t": "down", "i": "gpu-1"} in fake.published)
    other, theirs, _, _ = replica()
    theirs.polls.apply_report("gpu-1", InstanceReport({"x": WarmState.WARM}, None), 0)
    other.apply(heard({"t": "down", "i": "gpu-1", "r": "r1"}))
    assert not theirs.is_up("gpu-1")
    assert state(theirs, "gpu-1", "x") == "cold", "its warm models count nowhere"
    await swaps.aclose()
