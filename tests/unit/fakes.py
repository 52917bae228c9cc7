"""In-process parts for unit tests: a driver that records calls (and one whose loads end when
the test says), a clock the test moves (and an event loop that runs on it), and a gateway's live
state (registry, swap coordinator, router, preloader) wired from a config, with no network."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.config.settings import Settings
from swapgate.control.loops.preload import Preloader
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.routing.router import Router, policy_for
from swapgate.control.state import changes
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.coordinator import SwapCoordinator
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import Driver
from swapgate.errors import DriverError
from swapgate.metrics import Metrics


class FakeClock:
    """The live state's clock, moved by the test: timing rules are shown without sleeping
    through their durations (the registry, router, waiters and swaps all read it)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def recheck_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiters look at the clock again every few milliseconds of real time instead of every
    half second, so a moved fake clock is noticed at once."""
    monkeypatch.setattr(changes, "RECHECK_INTERVAL", 0.002)


async def eventually(condition: Callable[[], bool], within: float = 2.0) -> bool:
    """Whether ``condition`` holds within ``within`` real seconds (it is checked between the
    event loop's turns: what is asked is that the waiters react, not how long a rule lasts)."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + within
    while not condition():
        if loop.time() > ends:
            return False
        await asyncio.sleep(0.002)
    return True


class FakeDriver(Driver):
    """Records calls; loads take ``delay`` seconds and fail while ``fail`` is set; with
    ``loadable`` unset, ``check_loadable`` says no (a model whose own server is gone)."""

    def __init__(self, delay: float = 0.05, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.loadable = True
        self.calls: list[tuple[str, str]] = []
        self.url, self._headers = "http://fake", {}

    async def check_loadable(self, model: str) -> None:
        if not self.loadable:
            raise DriverError(f"{model}'s server does not answer")

    async def state(self) -> InstanceReport:
        return InstanceReport({}, None)

    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.calls.append(("cancelled", model))
            raise
        if self.fail:
            raise DriverError("boom")

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", model))


class HeldDriver(FakeDriver):
    """A backend whose loads last until the test ends them (``finish``: loaded, failed, or
    crashed with any exception) or leaves them hanging; it keeps what it has loaded, which its
    polls report (``down``: they fail), and tells ``on_load`` and ``on_unload`` of each load
    and unload as it begins."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: set[str] = set()
        self.asleep: set[str] = set()  # put to sleep, as vLLM's sleep mode keeps them (sleeps)
        self.loading: dict[str, asyncio.Future[None]] = {}
        self.down = False
        self.on_unload: Callable[[str], None] = lambda model: None
        self.on_load: Callable[[str], None] = lambda model: None

    async def state(self) -> InstanceReport:
        if self.down:
            raise DriverError("connection refused")
        asleep = dict.fromkeys(self.asleep - self.loaded, WarmState.ASLEEP)
        return InstanceReport({**asleep, **dict.fromkeys(self.loaded, WarmState.WARM)}, None)

    def sleeps(self) -> None:
        """From now on as vLLM's sleep mode: an unloaded model stays asleep, and a load of it
        wakes it (docs/configuration.md, ``kind: vllm-sleep``)."""
        self.evicts_to = WarmState.ASLEEP

    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        self.on_load(model)
        assert model not in self.loading, f"a second load of {model} while one runs"
        ended = self.loading[model] = asyncio.get_running_loop().create_future()
        try:
            await ended
        finally:
            del self.loading[model]
        self.loaded.add(model)

    def finish(self, model: str, error: BaseException | None = None) -> None:
        ended = self.loading[model]
        if error is None:
            ended.set_result(None)
        else:
            ended.set_exception(error)

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", model))
        self.on_unload(model)
        self.loaded.discard(model)
        if self.evicts_to is WarmState.ASLEEP:
            self.asleep.add(model)


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is a ``FakeClock``'s: the timeouts inside the live state
    (``swap_timeout``, a waiter's recheck, a load's abandon check) fire when the test moves the
    clock and never by themselves, so a run is the same every time and takes no real time."""

    # asyncio's own queues of what runs next, which typeshed leaves out: ``idle`` reads them
    _ready: deque[asyncio.Handle]
    _scheduled: list[asyncio.TimerHandle]
    _clock_resolution: float

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def time(self) -> float:
        return self.clock.now

    def idle(self) -> bool:
        """Nothing is left to run at the clock's present time (what ``_run_once`` would run)."""
        due = self.time() + self._clock_resolution
        timers = (h for h in self._scheduled if not h.cancelled() and h.when() < due)
        return not self._ready and next(timers, None) is None

    def shut(self) -> None:
        """Cancel whatever still runs on it, let it end, and close it."""
        pending = asyncio.all_tasks(self)
        for task in pending:
            task.cancel()
        if pending:
            self.run_until_complete(asyncio.wait(pending))
        self.close()

    def settle(self, turns: int = 10_000) -> None:
        """Run until nothing is left to run now; a loop still busy after ``turns`` turns never
        settles (something wakes itself forever)."""

        async def turn() -> bool:
            for _ in range(turns):
                await asyncio.sleep(0)
                if self.idle():
                    return True
            return False

        assert self.run_until_complete(turn()), f"still busy after {turns} turns of the loop"


@dataclass
class World:
    settings: Settings
    registry: Registry
    coordinator: SwapCoordinator
    router: Router
    preloader: Preloader
    drivers: dict[str, FakeDriver]
    metrics: Metrics

    def warm(self, instance: str, *models: str) -> None:
        """A poll says ``instance`` is up with ``models`` warm."""
        report = InstanceReport(dict.fromkeys(models, WarmState.WARM), None)
        self.registry.polls.apply_report(instance, report, self.registry.generation(instance))

    def state(self, instance: str, model: str) -> WarmState:
        return self.registry.snapshot().instance(instance).state_of(model)

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def world(
    config: dict[str, Any],
    delay: float = 0.05,
    clock: Callable[[], float] | None = None,
    driver: Callable[[], FakeDriver] | None = None,
    keeper: KvKeeper | None = None,
) -> World:
    """``clock``: a ``FakeClock`` for tests of timing rules; the real one otherwise;
    ``driver``: makes each instance's driver (a ``FakeDriver`` with loads of ``delay``);
    ``keeper``: saves the conversations of ``kv_keep`` instances before their unloads."""
    settings = parse_config(config)
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog, clock or time.monotonic)
    drivers = {inst.name: (driver or (lambda: FakeDriver(delay)))() for inst in settings.instances}
    metrics = Metrics()
    times = SwapTimes(settings.routing.expected_swap)
    for name, made in drivers.items():
        made.url = next(i.url for i in settings.instances if i.name == name)
    coordinator = SwapCoordinator(
        registry,
        dict(drivers),
        catalog,
        times,
        metrics,
        settings.routing.swap_timeout,
        keeper=keeper,
    )
    policy = policy_for(settings, times, registry.names)
    router = Router(settings, registry, coordinator, catalog, metrics, policy=policy)
    preloader = Preloader(registry, coordinator, policy, settings.routing.swap_timeout)
    return World(settings, registry, coordinator, router, preloader, drivers, metrics)


@dataclass
class Save:
    """A slot's save an engine is writing: held until the test ends it."""

    started: float
    path: Path  # where the engine writes it
    ended: asyncio.Future[bool]  # True: written; False: the engine failed


class SlotServers:
    """The llama-servers behind ``kv_keep`` instances, as their slot API answers swapgate's
    ``KvKeeper`` (docs/kv-keep.md): ``slots`` slots each, ``GET /props`` naming the model,
    restores at once, and each save held in ``saving`` until the test ends it (``end``) or
    leaves it to ``kv_keep.save_timeout``. ``folder``: where the engines write what they save."""

    def __init__(self, clock: FakeClock, folder: Path, slots: int = 2) -> None:
        self.clock, self.folder, self.slots = clock, folder, slots
        self.saving: dict[tuple[str, str, int], Save] = {}  # (instance, model, slot)
        self.began: list[tuple[str, str, int]] = []  # every save asked for, in order
        self.saved: list[tuple[str, str, str]] = []  # (instance, model, file), in order
        self.restored: list[tuple[str, str, str]] = []

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self._answer))

    def end(self, where: tuple[str, str, int], written: bool) -> None:
        self.saving[where].ended.set_result(written)

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        # http://INSTANCE/upstream/MODEL/slots[/N?action=...] or .../props, as llama-swap's
        instance, path = request.url.host, request.url.path.split("/")
        model, what = path[2], path[3:]
        if what == ["props"]:
            return httpx.Response(200, json={"model_path": f"/models/{model}.gguf", "n_ctx": 4096})
        if what == ["slots"]:
            return httpx.Response(200, json=[{"id": n} for n in range(self.slots)])
        slot, action = int(what[1]), request.url.params["action"]
        name = json.loads(request.content)["filename"]
        if action == "restore":
            self.restored.append((instance, model, name))
            return httpx.Response(200, json={"id_slot": slot})
        where = (instance, model, slot)
        assert where not in self.saving, f"slot {slot} of {model} on {instance} saved twice"
        ended = asyncio.get_running_loop().create_future()
        save = Save(self.clock(), self.folder / instance / name, ended)
        self.saving[where] = save
        self.began.append(where)
        try:
            written = await save.ended
        finally:
            del self.saving[where]
        if not written:
            return httpx.Response(500, json={"error": {"message": "failed to save the slot"}})
        save.path.write_bytes(b"kv" * 100)
        self.saved.append((instance, model, name))
        return httpx.Response(200, json={"id_slot": slot, "n_saved": 1})
