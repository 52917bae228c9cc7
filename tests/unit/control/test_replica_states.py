"""Two replicas over one fleet, under random traffic and faults (docs/deploy.md, "Several
replicas"; docs/operations.md, "When part of the fleet breaks"). A hypothesis state machine drives
two of everything a replica has (registry, swap coordinator with its ``SharedClaims``, router,
poller) over the same fake backends, sharing one in-memory cluster store whose locks and events
behave as swapgate/cluster/store.py's do on Redis, on one event loop whose time is a fake clock.

Steps: requests on either replica, completions, loads' ends (one model's always fail), instances
refusing a connection or failing their polls and coming back, time passing. After every step:
no backend runs two loads at once or holds more than its capacity; a swap either replica sees
runs on one of them (no request waits for a load nobody runs); a failing model loads on one
instance at most, fleet-wide; no request waits past its max_wait, or on after its model's loads
failed twice (once while it is failing); every request ends with a lease or a shaped error.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swapgate.cluster.locks import Holder
from swapgate.cluster.messages import Event, Heard, decode, encode
from swapgate.cluster.store import Listener
from swapgate.cluster.swaps import OperatorShares, SharedClaims
from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.loops.poller import DOWN_AFTER, Poller
from swapgate.control.routing.router import Router, policy_for
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.lease import Lease, Progress
from swapgate.errors import DriverError, InternalError, SwapgateError
from swapgate.metrics import Metrics
from swapgate.policy import backoff
from tests.unit.fakes import ClockLoop, FakeClock, HeldDriver

MODELS = ("m0", "m1", "m2", "m3")
BROKEN = "m3"  # its engine exits at every start, on every instance
FAILS = "the engine exited while loading"


class SharedStore:
    """One Redis for every replica: the swap locks (an instance's, a model's load) and the
    event channel, delivered to the other replicas at the loop's next turn."""

    def __init__(self) -> None:
        self.keys: dict[str, Holder] = {}
        self.listeners: dict[str, Listener] = {}

    def replica(self, name: str) -> Replica:
        return Replica(self, name)


@dataclass
class Replica:
    """One replica's view of the shared store (the ``Replicas`` protocol)."""

    store: SharedStore
    replica: str

    @property
    def locks(self) -> Replica:
        """Its swap locks: claim, release and holder are its own."""
        return self

    async def start(self, listener: Listener) -> None:
        self.store.listeners[self.replica] = listener

    async def aclose(self) -> None:
        self.store.listeners.pop(self.replica, None)

    async def claim(self, instance: str, model: str) -> Holder | None:
        await _round_trip()
        keys = self.store.keys
        held = keys.get(f"lock:{instance}") or keys.get(f"loading:{model}")
        if held is not None:
            return held
        mine = Holder(self.replica, instance, model)
        keys[f"lock:{instance}"] = keys[f"loading:{model}"] = mine
        return None

    async def release(self, instance: str) -> None:
        await _round_trip()
        keys = self.store.keys
        mine = keys.get(f"lock:{instance}")
        if mine is not None and mine.replica == self.replica:
            del keys[f"lock:{instance}"]
            if keys.get(f"loading:{mine.model}") == mine:
                del keys[f"loading:{mine.model}"]

    async def holder(self, instance: str) -> Holder | bool | None:
        await _round_trip()
        return self.store.keys.get(f"lock:{instance}")

    async def publish(self, event: Event) -> bool:
        await _round_trip()
        wire = encode(event, self.replica)  # as it travels: what does not survive it is lost
        loop = asyncio.get_running_loop()
        for name, listener in self.store.listeners.items():
            if name != self.replica:
                heard = decode(wire)
                assert isinstance(heard, Heard)
                loop.call_soon(listener.apply, heard)
        return True

    async def share(self, key: str, field_: str, value: str | None) -> bool:
        return True

    async def shared(self, key: str) -> dict[str, str]:
        return {}

    async def leads(self) -> bool:
        return self.replica == "r0"


@dataclass
class Side:
    """What one replica runs."""

    registry: Registry
    coordinator: SwapCoordinator
    router: Router
    poller: Poller
    claims: SharedClaims


@dataclass(eq=False)
class RequestedTimeout:
    side: int
    model: str
    arrived: float
    max_wait: float
    task: asyncio.Task[Lease]
    released: bool = False


def config(count: int, capacity: int) -> dict[str, Any]:
    return {
        "instances": [
            {"name": f"i{n}", "url": f"http://i{n}", "models": list(MODELS), "capacity": capacity}
            for n in range(count)
        ],
        "routing": {"min_residency": 0, "max_wait": "30s", "swap_timeout": "20s"},
    }


class TwoReplicas(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.loop = ClockLoop(self.clock)
        self.asked: list[RequestedTimeout] = []
        self.built = False

    @initialize(count=st.integers(1, 3), capacity=st.integers(1, 2))
    def build(self, count: int, capacity: int) -> None:
        settings_ = parse_config(config(count, capacity))
        catalog = Catalog(settings_)
        self.drivers = {i.name: HeldDriver() for i in settings_.instances}
        self.capacity = capacity
        store = SharedStore()
        self.sides = [self._side(settings_, catalog, store.replica(f"r{k}")) for k in (0, 1)]
        for side in self.sides:
            self.loop.run_until_complete(side.claims.connect())
            for name in self.drivers:
                self.loop.run_until_complete(side.poller.poll(name))
        self.built = True

    def _side(self, settings_: Any, catalog: Catalog, replica: Replica) -> Side:
        registry = Registry(settings_.instances, catalog, self.clock)
        times = SwapTimes(settings_.routing.expected_swap)
        claims = SharedClaims(registry, times, replica, OperatorShares(replica, self.clock))
        metrics = Metrics()
        r = settings_.routing
        coordinator = SwapCoordinator(
            registry, dict(self.drivers), catalog, times, metrics, r.swap_timeout, claims=claims
        )
        policy = policy_for(settings_, times, registry.names)
        router = Router(settings_, registry, coordinator, catalog, metrics, policy=policy)
        poller = Poller(registry, self.drivers, metrics, 5.0)
        return Side(registry, coordinator, router, poller, claims)

    # --- steps -----------------------------------------------------------------------------

    @rule(side=st.integers(0, 1), model=st.sampled_from(MODELS), count=st.integers(1, 3))
    def arrive(self, side: int, model: str, count: int) -> None:
        router = self.sides[side].router
        for _ in range(count):
            task = self.loop.create_task(router.acquire(model, Progress()))
            self.asked.append(
                RequestedTimeout(side, model, self.clock(), router.max_wait(model), task)
            )
        self.loop.settle()

    def _held(self) -> list[RequestedTimeout]:
        return [a for a in self.asked if _leased(a.task) and not a.released]

    @precondition(lambda self: self._held())
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        asked = data.draw(st.sampled_from(self._held()))
        asked.released = True
        self.sides[asked.side].router.release(asked.task.result())
        self.loop.settle()

    def _loads(self) -> list[tuple[str, str]]:
        return [(n, m) for n, d in self.drivers.items() for m in d.loading]

    @precondition(lambda self: self._loads())
    @rule(data=st.data(), ok=st.booleans())
    def load_ends(self, data: st.DataObject, ok: bool) -> None:
        name, model = data.draw(st.sampled_from(self._loads()))
        failed = model == BROKEN or not ok
        self.drivers[name].finish(model, DriverError(FAILS) if failed else None)
        self.loop.settle()

    @rule(seconds=st.sampled_from([0.3, 1.0, 6.0, 12.0, 40.0]))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.loop.settle()

    @rule(side=st.integers(0, 1), data=st.data())
    def refuse(self, side: int, data: st.DataObject) -> None:
        """A request on one replica met a refused connection: down there, and on the other."""
        name = data.draw(st.sampled_from(sorted(self.drivers)))
        self.sides[side].registry.polls.refused(name)
        self.loop.settle()

    @rule(data=st.data(), down=st.booleans())
    def poll(self, data: st.DataObject, down: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.drivers)))
        self.drivers[name].down = down
        for side in self.sides:
            for _ in range(DOWN_AFTER if down else 1):
                self.loop.run_until_complete(side.poller.poll(name))
        self.loop.settle()

    # --- what must hold ---------------------------------------------------------------------

    @invariant()
    def holds(self) -> None:
        if not self.built:
            return
        for name, driver in self.drivers.items():
            assert len(driver.loading) <= 1, f"{name} runs two loads: {set(driver.loading)}"
            held = driver.loaded | set(driver.loading)
            assert len(held) <= self.capacity, f"{name} holds {held}"
        for k, side in enumerate(self.sides):  # a swap seen from a replica runs on one
            for name in self.drivers:
                model = side.registry.swapping(name)
                running = any(s.coordinator.busy(name) for s in self.sides)
                assert model is None or running, f"r{k} waits for {model} on {name}: nobody loads"
        loading = [m for d in self.drivers.values() for m in d.loading]
        for side in self.sides:
            for model in side.registry.failing.all():
                assert loading.count(model) <= 1, f"failing {model} loads {loading.count(model)}x"
        for asked in self.asked:
            book = self.sides[asked.side].registry.failing
            if asked.task.done():
                self._ended(asked)
                continue
            late = self.clock() - (asked.arrived + asked.max_wait)
            assert late <= 1e-6, f"a request for {asked.model} waits {late:g}s too long"
            tried = book.since(asked.model, asked.arrived)
            assert len(tried) < backoff.ATTEMPTS, f"a request waits on after {tried}"
            assert not (tried and book.of(asked.model)), "a request waits for a failing model"

    def _ended(self, asked: RequestedTimeout) -> None:
        task = asked.task
        assert not task.cancelled(), f"a request for {asked.model} was cancelled by swapgate"
        error = task.exception()
        if error is not None:
            shaped = isinstance(error, SwapgateError) and not isinstance(error, InternalError)
            assert shaped, f"a request for {asked.model} failed with {error!r}"

    def teardown(self) -> None:
        loop = self.loop
        try:
            if self.built:
                for asked in self._held():
                    asked.released = True
                    self.sides[asked.side].router.release(asked.task.result())
                for name, model in self._loads():
                    self.drivers[name].finish(model, DriverError(FAILS))
                self.clock.advance(1000.0)
                loop.settle()
                assert all(a.task.done() for a in self.asked), "requests wait after max_wait"
                for asked in self.asked:
                    self._ended(asked)
                for side in self.sides:
                    loop.run_until_complete(side.coordinator.aclose())
                    loop.run_until_complete(side.claims.aclose())
        finally:
            loop.shut()


async def _round_trip() -> None:
    """A call to Redis lets the loop run others before it is done, as the network does."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _leased(task: asyncio.Task[Lease]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


TwoReplicas.TestCase.settings = settings(
    max_examples=int(os.environ.get("SWAPGATE_FUZZ_EXAMPLES", "100")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_replicas = TwoReplicas.TestCase
