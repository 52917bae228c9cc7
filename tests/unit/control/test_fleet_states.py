"""Random fleets under random traffic (docs/architecture.md, "The invariants"). Whatever the fleet
and whatever happens to it, a user never sees a 500 or a request that never ends (each ends with
a lease or one of swapgate's shaped errors), never waits past max_wait, never loses the model
serving their request (nothing is evicted while it serves, is pinned or has requests waiting for
it), and no instance is asked to hold more than its capacity or memory, nor to run two swaps at
once.

A hypothesis state machine drives the real router, swap coordinator, queues, registry, poller,
preloader and placement, with a fake clock (which is also the event loop's: ``ClockLoop``) and
fake backends whose loads end when a step says: loaded, failed, crashed, or left to hang past
``swap_timeout``. Fleets: 1-16 instances of capacity 1-4, with or without memory limits and
sized models, pools, selectors, max_concurrency, per-model max_wait, either eviction rule,
clients in lockstep (the agent rule) or none, relays, backends that keep what they unload
asleep (vLLM's sleep mode, waking it for its next load), instances that save their
conversations before an unload (``kv_keep``: the real ``KvKeeper`` over fake slot servers whose
saves end when a step says, or run out of ``save_timeout``), and maybe a model whose every load
fails.
Steps: arrivals alone or several in one turn of the loop, completions, cancellations, loads'
ends, instances going down (failed polls, or a refused connection) and coming back, polls,
pins, drains, preloads, reloads and time passing. A model whose loads fail is loaded once at a
time while failing, and only as its probe; no request waits on after its load attempts; no
model is unloaded while its conversations are being saved, and no save outlasts
``save_timeout``.
``make fuzz`` runs many more examples
(``SWAPGATE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Coroutine, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.config.settings import Settings
from swapgate.control.loops.poller import DOWN_AFTER, Poller
from swapgate.control.loops.preload import Preloader, PreloadResult
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.memory.kv.book import Claim
from swapgate.control.memory.kv.turns import TurnSlots
from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.router import Router, policy_for
from swapgate.data.lease import Lease, Progress
from swapgate.data.snapshot import InstanceView, Snapshot
from swapgate.data.warm import WarmState
from swapgate.errors import DriverError, InternalError, SwapgateError
from swapgate.metrics import Metrics
from swapgate.policy import backoff
from tests.unit.fakes import ClockLoop, FakeClock, HeldDriver, SlotServers, world

T = TypeVar("T")
# Issue 63's crash (an empty reduction in placement, reached once a fleet of capacity above one
# fills with cold models) was found by 11 of 12 runs of 60 examples on the code before its fix:
# the suite's 200 find it in every run. ``make fuzz`` sets SWAPGATE_FUZZ_EXAMPLES to search longer.
EXAMPLES = int(os.environ.get("SWAPGATE_FUZZ_EXAMPLES", "200"))
FLEETS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MODELS = tuple(f"m{k}" for k in range(12))
CLIENTS = ("agent-1", "agent-2", None)  # None: a request without a client key
PRIORITIES = st.sampled_from([0, 0, 10, -10])
BUDGETS = st.sampled_from([None, None, 0.5, 5.0])  # x-swapgate-max-wait
TOKENS = st.sampled_from([10, 500, 5000])  # the prompt's size: the pool it goes to
OPERATIONS = ("pin", "unpin", "drain", "undrain", "preload", "reload")
# Longer than any max_wait or swap_timeout here: past it, every wait and hanging load has ended
LONG_AFTER = 1000.0
SAVE_TIMEOUT = 2.0  # kv_keep's: a save left hanging ends after it
KV_DIR = "{kv}"  # where a kv_keep instance's engine saves, in the example's own folder


@dataclass(frozen=True)
class Fleet:
    """A config and how its traffic and backends behave."""

    config: dict[str, Any]
    models: tuple[str, ...]
    names: tuple[str, ...]  # what a request may ask for: models, and selectors of them
    agents: bool  # requests come through Attempts with client keys (the agent rule learns them)
    cancels_loads: bool  # a load cancelled is stopped (process instances) or goes on by itself
    # What each backend has loaded when swapgate starts: the fleet is full from the first step
    loaded: dict[str, list[str]] = field(default_factory=dict)
    broken: str | None = None  # a model whose every load fails, on every instance
    sleeps: bool = False  # its backends keep what they unload asleep (vLLM's sleep mode)
    keeps: tuple[str, ...] = ()  # the instances that save conversations (kv_keep)


@st.composite
def instances(draw: st.DrawFn, models: tuple[str, ...]) -> dict[str, Any]:
    """An instance's config but its name: what it serves, its capacity and memory."""
    every = draw(st.booleans())  # a fleet where every instance serves every model fills soonest
    serves = models if every else draw(st.lists(st.sampled_from(models), min_size=1, unique=True))
    conf: dict[str, Any] = {"models": list(serves)}
    memory = draw(st.none() | st.sampled_from([16, 24, 40]))
    if memory is not None:
        conf["memory"] = f"{memory}GiB"
    if memory is None or draw(st.booleans()):  # memory alone limits it, or both do
        conf["capacity"] = draw(st.integers(1, 4))
    return conf


@st.composite
def model_settings(draw: st.DrawFn, serving: list[str]) -> dict[str, Any]:
    """A model's size and routing keys; pools of the instances ``serving`` it."""
    conf: dict[str, Any] = {}
    if draw(st.booleans()):
        conf["memory"] = f"{draw(st.sampled_from([4, 8, 12, 20]))}GiB"
    if draw(st.integers(0, 3)) == 0:
        conf["max_concurrency"] = draw(st.integers(1, 2))
    if draw(st.integers(0, 3)) == 0:
        conf["max_wait"] = draw(st.sampled_from(["3s", "30s"]))
    if draw(st.integers(0, 3)) == 0:  # its relay, for some of its waits (docs/configuration.md)
        conf["relay"] = "hosted"
        conf["fallback"] = draw(st.sampled_from(["error", "slow", "swap"]))
    if len(serving) >= 2 and draw(st.booleans()):
        short = draw(st.lists(st.sampled_from(serving), min_size=1, unique=True))
        long = draw(st.lists(st.sampled_from(serving), min_size=1, unique=True))
        limit = draw(st.sampled_from([None, 1000]))  # 1000: the longest prompts fit no pool
        conf["pools"] = [
            {"name": "short", "instances": short, "max_prompt_tokens": 100},
            {"name": "long", "instances": long, "max_prompt_tokens": limit},
        ]
    return conf


@st.composite
def routing(draw: st.DrawFn) -> dict[str, Any]:
    drawn = {
        "max_wait": draw(st.sampled_from(["2s", "10s", "60s"])),
        "swap_timeout": draw(st.sampled_from(["1s", "5s", "30s"])),
        "min_residency": draw(st.sampled_from([None, 0, 0, "3s", "60s"])),
        "eviction": draw(st.sampled_from(["lru", "demand"])),
        "queue_limit": draw(st.sampled_from([256, 2, 6])),
        "starvation_after": draw(st.sampled_from([None, 0.1, 0.5])),
        "max_passover": draw(st.sampled_from([None, None, "1s", "8s"])),
        "expected_swap": draw(st.sampled_from([None, "1s", "20s"])),
    }
    return {key: value for key, value in drawn.items() if value is not None}


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    models = MODELS[: draw(st.integers(1, len(MODELS)))]
    # Half the fleets small: a few instances fill, and then evict, within a few steps. (A list,
    # not a count: a failure shrinks to the instances it needs, whichever they are.)
    shape = instances(models)
    drawn = draw(st.lists(shape, min_size=1, max_size=3) | st.lists(shape, min_size=1, max_size=16))
    confs = [{"name": f"i{k}", "url": f"http://i{k}", **c} for k, c in enumerate(drawn)]
    agents = draw(st.booleans())
    served = {m: [c["name"] for c in confs if m in c["models"]] for m in models}
    # Every model is named under models, served or not: a selector may name it then.
    model_confs = {m: draw(model_settings(served[m])) for m in models}
    selectors = []
    if len(models) >= 2:
        for k in range(draw(st.integers(0, 2))):
            targets = draw(st.lists(st.sampled_from(models), min_size=2, max_size=3, unique=True))
            strategy = draw(st.sampled_from(["warm", "first"]))
            model_confs[f"s{k}"] = {"choose": {"from": targets, "strategy": strategy}}
            selectors.append(f"s{k}")
    config = {
        "instances": confs,
        "models": model_confs,
        "routing": draw(routing()),
        "relays": {"hosted": {"url": "https://relay.example/v1"}},
    }
    loaded = {c["name"]: draw(already_loaded(c, model_confs)) for c in confs}
    names = models + tuple(selectors)
    broken = draw(st.none() | st.sampled_from(models))
    sleeps = draw(st.booleans())
    keeps: list[str] = []
    if draw(st.booleans()):
        keeps = draw(st.lists(st.sampled_from([c["name"] for c in confs]), min_size=1, unique=True))
    for conf in confs:
        if conf["name"] in keeps:
            conf["kv_keep"] = {"dir": f"{KV_DIR}/{conf['name']}", "save_timeout": SAVE_TIMEOUT}
    cancels = draw(st.booleans())
    return Fleet(config, models, names, agents, cancels, loaded, broken, sleeps, tuple(keeps))


@st.composite
def already_loaded(
    draw: st.DrawFn, instance: dict[str, Any], models: dict[str, dict[str, Any]]
) -> list[str]:
    """Some of what ``instance`` serves, within its capacity and memory."""
    most = min(instance.get("capacity", 4), len(instance["models"]))
    least = draw(st.sampled_from([0, most]))  # full half the time: it evicts from the first step
    some = draw(
        st.lists(st.sampled_from(instance["models"]), unique=True, min_size=least, max_size=most)
    )
    room, taken = _gib(instance.get("memory")), []
    for model in some:
        size = _gib(models[model].get("memory")) or 0
        if room is None or size <= room:
            taken.append(model)
            room = None if room is None else room - size
    return taken


def _in_folder(config: dict[str, Any], folder: str) -> dict[str, Any]:
    """``config`` with its kv_keep folders under ``folder``."""
    config = copy.deepcopy(config)
    for conf in config["instances"]:
        if "kv_keep" in conf:
            conf["kv_keep"]["dir"] = conf["kv_keep"]["dir"].format(kv=folder)
    return config


def _gib(size: str | None) -> int | None:
    return None if size is None else int(size.removesuffix("GiB"))


@dataclass(eq=False, repr=False)
class Request:
    """One request as the steps see it: what it asked, when, and how it ended."""

    number: int
    arrived: float
    router: Router  # the one of its arrival: a reload makes a new one for later requests
    task: asyncio.Task[Lease] = field(init=False)
    model: str = ""
    max_wait: float = float("inf")  # known once its Routing is
    pool: frozenset[str] | None = None  # the instances it may use (None: any)
    attempts: Attempts | None = None  # with a client key: it opens and closes its ticket
    claim: Claim | None = None  # its engine slot on a kv_keep instance
    cancelled: bool = False
    released: bool = False

    def __repr__(self) -> str:
        return f"request {self.number}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how a failing example says it
        printer.text(repr(self))


@dataclass
class Tasks:
    """Every task the loop runs, so that one of swapgate's own that dies is seen at once."""

    made: list[asyncio.Task[Any]] = field(default_factory=list)

    def __call__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        **kwargs: Any,
    ) -> asyncio.Future[T]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.made.append(task)
        return task


def _leased(task: asyncio.Task[Lease]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


class FleetStates(RuleBasedStateMachine):
    """One fleet per example, on an event loop of its own whose time is the fake clock: each
    step acts, then runs the loop until nothing is left to run now, then every invariant is
    checked; at the end every lease goes back and every wait runs out."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.loop = ClockLoop(self.clock)
        self.tasks = Tasks()
        self.loop.set_task_factory(self.tasks)
        self.loop.set_exception_handler(self._loop_error)
        self.requests: list[Request] = []
        self.preloads: list[asyncio.Task[PreloadResult]] = []
        self.problems: list[str] = []  # what went wrong inside a task, said at the next check
        self.seen: set[str] = set()  # what the example went through, for the statistics
        self.rooms: dict[str, str | None] = {}  # the model the room on each instance is for
        self.probed: dict[str, float] = {}  # each failing model's probe its last load took
        self.broken = False  # a check failed: teardown only cleans up
        self.built = False
        self.keeper: KvKeeper | None = None
        self.slots = TurnSlots(None)

    # --- the fleet -------------------------------------------------------------------------

    @initialize(fleet=fleets())
    def build(self, fleet: Fleet) -> None:
        self.fleet, self.config = fleet, fleet.config
        if fleet.keeps:  # the slot servers save into a folder of the example's own
            self.folder = tempfile.mkdtemp(prefix="swapgate-kv-")
            self.config = _in_folder(fleet.config, self.folder)
            self.engines = SlotServers(self.clock, Path(self.folder))
            self.kv_client = self.engines.client()
            self.keeper = KvKeeper(self.kv_client, Metrics(), self.clock)
            self.slots = TurnSlots(self.keeper)
        w = world(self.config, clock=self.clock, driver=HeldDriver, keeper=self.keeper)
        self.registry, self.coordinator, self.metrics = w.registry, w.coordinator, w.metrics
        self.drivers = {n: d for n, d in w.drivers.items() if isinstance(d, HeldDriver)}
        for name, driver in self.drivers.items():
            driver.cancels_loads = fleet.cancels_loads
            driver.loaded = set(fleet.loaded.get(name, ()))
            driver.on_unload = functools.partial(self._unloading, name)
            driver.on_load = functools.partial(self._loading, name)
            if fleet.sleeps:
                driver.sleeps()
        self.poller = Poller(self.registry, self.drivers, self.metrics, 5.0)
        # Drawn from at every step: made once (a strategy made anew each draw costs more
        # than the step it draws for)
        clients = st.sampled_from(CLIENTS) if fleet.agents else st.none()
        self.asks = st.tuples(st.sampled_from(fleet.names), PRIORITIES, clients, BUDGETS, TOKENS)
        self.instances = st.sampled_from(sorted(self.drivers))
        self.models = st.sampled_from(fleet.models)
        self._configure(w.settings)
        for name in self.drivers:  # up, with what its backend has loaded
            self.loop.run_until_complete(self.poller.poll(name))
        if self.keeper is not None:
            self.loop.run_until_complete(self._served_before(self.keeper))
        self.built = True

    async def _served_before(self, keeper: KvKeeper) -> None:
        """A turn of a conversation served on each model a kv_keep instance holds: the fleet
        was in use before the example's first step, so its first evictions save."""
        for name in self.fleet.keeps:
            for model in self.drivers[name].loaded:
                server = keeper.server(name, self.drivers[name].url, model)
                claim = await keeper.prepare(name, model, f"earlier-{model}", None, server)
                assert claim is not None
                await keeper.finish(claim)

    def _configure(self, settings: Settings) -> None:
        """The parts a config builds, as the runtime builds them at a start and a reload."""
        catalog = Catalog(settings)
        r = settings.routing
        self.registry.reconfigure(settings.instances, catalog)
        self.coordinator.reconfigure(
            dict(self.drivers), catalog, r.swap_timeout, r.expected_swap, r.eviction
        )
        policy = policy_for(settings, self.coordinator.times, self.registry.names)
        self.router = Router(
            settings, self.registry, self.coordinator, catalog, self.metrics, policy=policy
        )
        self.preloader = Preloader(self.registry, self.coordinator, policy, r.swap_timeout)
        if self.keeper is not None:
            self.keeper.configure(settings.instances)

    # --- requests --------------------------------------------------------------------------

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        self._arrive(data)
        self.loop.settle()

    @rule(data=st.data(), count=st.integers(2, 4))
    def arrive_together(self, data: st.DataObject, count: int) -> None:
        """Several requests in one turn of the loop, as a busy gateway takes them."""
        for _ in range(count):
            self._arrive(data)
        self.loop.settle()

    def _arrive(self, data: st.DataObject) -> None:
        self.ask(*data.draw(self.asks))

    def ask(
        self,
        name: str,
        priority: int = 0,
        client: str | None = None,
        budget: float | None = None,
        tokens: int = 10,
    ) -> Request:
        """A request for ``name`` arrives (its task runs at the loop's next turn)."""
        request = Request(len(self.requests) + 1, self.clock(), self.router)
        work = self._ask(request, name, priority, client, budget, tokens)
        request.task = self.loop.create_task(work)
        self.requests.append(request)
        return request

    async def _ask(
        self,
        request: Request,
        name: str,
        priority: int,
        client: str | None,
        budget: float | None,
        tokens: int,
    ) -> Lease:
        """What the data plane asks of the router for one request (proxy/handler.py)."""
        router = request.router
        model = request.model = router.intake.chosen(name)
        payload = {"prompt": "word" * tokens}
        routing = router.intake.routing_for(model, payload, budget, priority, client=client)
        request.max_wait = routing.budget if routing.budget is not None else router.max_wait(model)
        request.pool = routing.pool.instances if routing.pool is not None else None
        attempts = request.attempts = (
            Attempts(router, model, routing) if self.fleet.agents else None
        )
        lease: Lease | None = None
        try:
            if attempts is None:
                lease = await router.acquire(model, Progress(), routing)
            else:
                lease = await attempts.first(Progress())
            # A turn of its client's conversation: its slot on a kv_keep instance
            lease, request.claim = await self.slots.claim(lease, f"{client}-{model}", client)
            return lease
        except BaseException:
            if attempts is not None:
                attempts.release()
            elif lease is not None:
                router.release(lease)
            raise

    def _held(self) -> list[Request]:
        return [r for r in self.requests if _leased(r.task) and not r.released]

    def _waiting(self) -> list[Request]:
        return [r for r in self.requests if not r.task.done()]

    @precondition(lambda self: self._held())
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        self._release(data.draw(st.sampled_from(self._held())))
        self.loop.settle()

    def _release(self, request: Request) -> None:
        """Its answer is over: its lease goes back."""
        request.released = True
        if request.claim is not None:
            self.loop.create_task(self.slots.free(request.claim))
        if request.attempts is not None:
            request.attempts.release()
        else:
            request.router.release(request.task.result())

    @precondition(lambda self: self._waiting())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """The client goes away while its request waits."""
        request = data.draw(st.sampled_from(self._waiting()))
        request.cancelled = True
        request.task.cancel()
        self.loop.settle()

    # --- loads and instances ---------------------------------------------------------------

    def _loads(self) -> list[tuple[str, str]]:
        return [(name, model) for name, d in self.drivers.items() for model in d.loading]

    @precondition(lambda self: self._loads())
    @rule(data=st.data(), outcome=st.sampled_from(["loaded", "loaded", "failed", "crashed"]))
    def load_ends(self, data: st.DataObject, outcome: str) -> None:
        """A load ends: loaded, failed as drivers fail (DriverError), or crashed with what no
        driver should raise (a bug of a driver's: its swap fails, the instance goes on). One
        left alone hangs until the clock passes swap_timeout."""
        name, model = data.draw(st.sampled_from(self._loads()))
        error: BaseException | None = None
        if model == self.fleet.broken:
            outcome = "failed"  # its engine exits at every start
        if outcome == "failed":
            error = DriverError("the engine exited while loading")
        elif outcome == "crashed":
            error = data.draw(st.sampled_from([RuntimeError, ConnectionResetError]))("crash")
        self.drivers[name].finish(model, error)
        self.loop.settle()

    @precondition(lambda self: self.fleet.broken is not None)
    @rule(data=st.data())
    def ask_broken(self, data: st.DataObject) -> None:
        """A request for the model that cannot load (as often as for all the rest)."""
        _, priority, client, budget, tokens = data.draw(self.asks)
        assert self.fleet.broken is not None
        self.ask(self.fleet.broken, priority, client, budget, tokens)
        self.loop.settle()

    @precondition(lambda self: any(m == self.fleet.broken for _, m in self._loads()))
    @rule()
    def broken_load_fails(self) -> None:
        """The broken model's engine exits as it starts."""
        for name, model in self._loads():
            if model == self.fleet.broken:
                self.drivers[name].finish(model, DriverError("the engine exited while loading"))
        self.loop.settle()

    @precondition(lambda self: len(self._loads()) > 1)
    @rule()
    def loads_end_together(self) -> None:
        """Every running load ends (well, but the broken model's) in one turn of the loop."""
        for name, model in self._loads():
            failed = DriverError("the engine exited while loading")
            self.drivers[name].finish(model, failed if model == self.fleet.broken else None)
        self.loop.settle()

    @precondition(lambda self: self.keeper is not None and self.engines.saving)
    @rule(data=st.data(), written=st.booleans())
    def save_ends(self, data: st.DataObject, written: bool) -> None:
        """A kv_keep instance's engine ends a slot's save: written, or failed. One left alone
        runs out of save_timeout."""
        self.engines.end(data.draw(st.sampled_from(sorted(self.engines.saving))), written)
        self.loop.settle()

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0, 4.0, 15.0, 90.0]))
    def wait(self, seconds: float) -> None:
        """Time passes: a residency, a starvation point, a swap_timeout, a max_wait."""
        self.clock.advance(seconds)
        self.loop.settle()

    @rule(data=st.data(), down=st.booleans())
    def poll(self, data: st.DataObject, down: bool) -> None:
        """An instance fails as many polls in a row as take it down, or answers one (and is
        up again): with what its backend has loaded."""
        name = data.draw(self.instances)
        self.drivers[name].down = down
        for _ in range(DOWN_AFTER if down else 1):
            self.loop.run_until_complete(self.poller.poll(name))
        self.loop.settle()

    @rule(data=st.data())
    def refuse(self, data: st.DataObject) -> None:
        """An instance refuses a request's connection (it died): down at once, until a poll
        finds it back."""
        self.registry.polls.refused(data.draw(self.instances))
        self.loop.settle()

    @rule(data=st.data(), action=st.sampled_from(OPERATIONS))
    def operate(self, data: st.DataObject, action: str) -> None:
        """What an operator does by the admin API: pin a model on an instance (for a few
        seconds or minutes), unpin it, drain an instance or put it back, preload a model
        (pinned there, or not) or reload the config."""
        name, model = data.draw(self.instances), data.draw(self.models)
        operator = self.registry.operator
        if action in ("drain", "undrain"):
            operator.set_drained(name, action == "drain")
        elif action == "pin":
            operator.pin(name, model, self.clock() + data.draw(st.sampled_from([5.0, 120.0])))
        elif action == "unpin":
            operator.unpin(name, model)
        elif action == "preload":
            count, pin_for = data.draw(st.integers(1, 2)), data.draw(st.sampled_from([0, 30]))
            work = self.preloader.preload(model, count, pin_for=pin_for)
            self.preloads.append(self.loop.create_task(work))
        else:
            self._reload(data)
        self.loop.settle()

    def _reload(self, data: st.DataObject) -> None:
        """The config reloaded with looser limits or other rules: what is warm stays (never
        below what is resident: that is the operator's to unload)."""
        config = copy.deepcopy(self.config)
        routing = config["routing"]
        change = data.draw(st.sampled_from(["eviction", "residency", "capacity", "memory"]))
        conf = data.draw(st.sampled_from(config["instances"]))
        if change == "eviction":
            routing["eviction"] = "demand" if routing["eviction"] == "lru" else "lru"
        elif change == "residency":
            routing["min_residency"] = data.draw(st.sampled_from([0, "3s", "60s"]))
        elif change == "capacity" and "capacity" in conf:
            conf["capacity"] += 1
        elif change == "memory" and "memory" in conf:
            conf["memory"] = f"{(_gib(conf['memory']) or 0) + 8}GiB"
        self.config = config
        self._configure(parse_config(config))

    # --- what must hold after every step ---------------------------------------------------

    def _unloading(self, instance: str, model: str) -> None:
        """An unload begins: the model must be neither serving, pinned, nor waited for."""
        snap = self.registry.snapshot()
        view = snap.instance(instance).models.get(model)
        if view is None:
            self.problems.append(f"{model} unloaded from {instance}, where it never was")
        elif view.inflight or view.pinned_until > snap.now or view.waiting > view.for_slot:
            self.problems.append(f"{model} unloaded from {instance} as it was {view}")
        if instance in self.fleet.keeps:
            self.seen.add("a model left an instance that keeps conversations")
        if self.keeper is not None and any(w[:2] == (instance, model) for w in self.engines.saving):
            self.problems.append(f"{model} unloaded from {instance} while its slots were saved")

    def _loading(self, instance: str, model: str) -> None:
        """A load begins: of a model failing, only as its one probe, taken at this instant or,
        on a kv_keep instance, before its victims' conversations were saved (docs/operations.md,
        "When part of the fleet breaks")."""
        failing = self.registry.failing.of(model)
        if failing is None:
            return
        self.seen.add("a failing model was probed")
        due = self.clock() + backoff.probe_delay(failing.failed_probes + 1)
        taken_ago = due - failing.next_probe
        saves = SAVE_TIMEOUT * 4 if instance in self.fleet.keeps else 0.0  # up to 4 victims
        once = self.probed.get(model) != failing.next_probe
        if not (-1e-6 <= taken_ago <= saves + 1e-6 and once):
            self.problems.append(f"{model} loaded on {instance} while failing, not as its probe")
        self.probed[model] = failing.next_probe

    def _check_faults(self, snap: Snapshot) -> None:
        """A failing model loads on one instance at most; no request waits on after its
        model's loads failed ``ATTEMPTS`` times, or once when it is failing."""
        book = self.registry.failing
        for model in book.all():
            self.seen.add("a model was failing")
            loading = [i.name for i in snap.instances if i.state_of(model) is WarmState.LOADING]
            assert len(loading) <= 1, f"failing {model} loads on {loading}"
        for request in self._waiting():
            tried = book.since(request.model, request.arrived)
            assert len(tried) < backoff.ATTEMPTS, f"{request} waits on after {tried}"
            assert not (tried and book.of(request.model)), f"{request} waits for failing model"

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.problems.append(f"the event loop was told: {context}")

    @invariant()
    def holds(self) -> None:
        if not self.built:
            return
        try:
            self._check()
        except BaseException:
            self.broken = True
            raise

    def _check(self) -> None:
        assert not self.problems, self.problems
        self._check_tasks()
        snap = self.registry.snapshot()
        if snap.unheld:
            self.seen.add("the agent rule found a model held for nobody")
        for view in snap.instances:
            name, driver = view.name, self.drivers[view.name]
            if view.reserved_for is not None and self.rooms.get(name) != view.reserved_for:
                self.seen.add("the starvation rule made room")
                self._check_room(view)  # as it made it: a reload may change capacity later
            self.rooms[name] = view.reserved_for
            # A swap's victims count until they are unloaded: on a kv_keep instance, while
            # their conversations are saved, beside the model loading for them
            leaving = [m for m, v in view.models.items() if v.closing] if view.evicting else []
            resident = view.resident - len(leaving)
            used = view.used - sum(view.sizes.get(m, 0) for m in leaving)
            assert resident <= view.capacity, f"{name} past its capacity: {view}"
            assert view.memory is None or used <= view.memory, f"{name} past memory: {view}"
            swapping = self.registry.swapping(name)
            assert self.coordinator.busy(name) == (swapping is not None), (
                f"{name}: the registry says it swaps {swapping}, the coordinator disagrees"
            )
            assert set(driver.loading) <= {swapping}, f"{name} loads {set(driver.loading)}"
            # What the backend really holds, as it would run out of memory: within the limits
            # too, though the registry forgets it when the instance goes down
            held = driver.loaded | set(driver.loading)
            assert len(held) <= view.capacity, f"{name}'s backend holds {held}: {view}"
            taken = sum(view.sizes.get(m, 0) for m in held)
            assert view.memory is None or taken <= view.memory, f"{name}'s backend: {held}"
        self._check_faults(snap)
        if self.keeper is not None:
            for where, save in self.engines.saving.items():
                assert snap.now - save.started <= SAVE_TIMEOUT + 1e-6, f"{where} saves on"
        for request in self.requests:
            if request.task.done():
                self._check_ended(request)
            else:
                late = snap.now - (request.arrived + request.max_wait)
                assert late <= 1e-6, f"a request for {request.model} waits {late:g}s too long"
        for preload in self.preloads:
            if preload.done() and not preload.cancelled():
                assert preload.exception() is None, f"a preload failed: {preload.exception()!r}"

    def _check_room(self, view: InstanceView) -> None:
        """The starvation rule made room where a request it made it for may go, and closed
        no more than the one place it needs there (by count: memory may need more)."""
        model = view.reserved_for
        waiting = [r for r in self._waiting() if r.model == model]
        usable = [r for r in waiting if r.pool is None or view.name in r.pool]
        assert usable or not waiting, f"room for {model} on {view.name}, outside its pools"
        closed = [m for m, v in view.models.items() if v.closing]
        if view.evicting or view.memory is not None:
            return  # a swap's own victims close too; bytes may take several
        needed = max(0, view.resident - view.capacity + 1)
        assert len(closed) <= needed, f"{view.name} closed {closed} for {view.reserved_for}: {view}"

    def _check_tasks(self) -> None:
        """Every task of swapgate's own that ended ended well: a swap's, whatever its load did
        (a load's own error is its swap's to read)."""
        mine = {r.task for r in self.requests} | set(self.preloads)
        for task in self.tasks.made:
            if not task.done() or task in mine or task.cancelled():
                continue
            coro = task.get_coro()
            if getattr(coro, "__qualname__", "") == "HeldDriver.load":
                continue
            error = task.exception()
            assert error is None, f"{task.get_name()} died: {error!r}"
        self.tasks.made = [t for t in self.tasks.made if not t.done()]

    def _check_ended(self, request: Request) -> None:
        task = request.task
        if task.cancelled():
            assert request.cancelled, f"a request for {request.model} was cancelled by swapgate"
            return
        error = task.exception()
        if error is None:
            return
        shaped = isinstance(error, SwapgateError) and not isinstance(error, InternalError)
        if not shaped:
            raise AssertionError(f"a request for {request.model} failed with {error!r}") from error

    # --- the end ---------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.built and not self.broken:
                self._tell()
                self._wind_down()
        finally:
            self._close()

    def _tell(self) -> None:
        """What the example went through (``--hypothesis-show-statistics`` counts them)."""
        for metric in self.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "swapgate_swaps_total":
                    self.seen.add(f"a swap ended {sample.labels['result']}")
        if any(call[0] == "unload" for d in self.drivers.values() for call in d.calls):
            self.seen.add("a model was evicted")
        if any(_leased(r.task) for r in self.requests):
            self.seen.add("a request was served")
        if any(_leased(r.task) and r.task.result().kind == "relay" for r in self.requests):
            self.seen.add("a request was relayed")
        if any(d.asleep & {m for c, m in d.calls if c == "load"} for d in self.drivers.values()):
            self.seen.add("a model asleep was woken")
        if self.keeper is not None:
            self.seen.add("a fleet kept conversations")
            if any(r.claim for r in self.requests):
                self.seen.add("a turn went to its slot")
            if self.engines.began:
                self.seen.add("a model's conversations were being saved")
            if self.engines.saved:
                self.seen.add("a conversation was saved before its model left")
            if self.engines.restored:
                self.seen.add("a saved conversation was restored")
        if currently_in_test_context():  # not in the step-by-step tests below
            for seen in sorted(self.seen):
                event(seen)

    def _wind_down(self) -> None:
        """Every lease given back and every wait and hanging load over: every request ended
        as it should, and nothing is left queued, waiting or in flight."""
        for _ in range(3):
            for request in self._held():
                self._release(request)
            self.clock.advance(LONG_AFTER)
            self.loop.settle()
            self._check()
        assert not self._waiting(), "requests still wait after every max_wait passed"
        assert all(p.done() for p in self.preloads), "a preload outlived its swap_timeout"
        assert self.registry.queues.depths() == {}
        assert self.registry.in_flight() == {}
        waiting = {
            (i.name, m): v.waiting
            for i in self.registry.snapshot().instances
            for m, v in i.models.items()
            if v.waiting
        }
        assert waiting == {}, f"counted as waiting after every request ended: {waiting}"

    def _close(self) -> None:
        loop = self.loop
        if self.built:
            loop.run_until_complete(self.coordinator.aclose())
        if self.keeper is not None:
            loop.run_until_complete(self.kv_client.aclose())
            shutil.rmtree(self.folder, ignore_errors=True)
        loop.shut()


FleetStates.TestCase.settings = FLEETS
test_fleet_states = FleetStates.TestCase


# --- what it found, step by step ---------------------------------------------------------------


def started(
    instances: list[dict[str, Any]],
    models: dict[str, dict[str, Any]] | None = None,
    loaded: dict[str, list[str]] | None = None,
    **routing: Any,
) -> FleetStates:
    """A machine on this fleet, its backends holding ``loaded``, ready for steps."""
    names = tuple(sorted({m for conf in instances for m in conf["models"]}))
    confs = [{"url": f"http://{c['name']}", **c} for c in instances]
    keeps = tuple(c["name"] for c in confs if "kv_keep" in c)
    config = {"instances": confs, "models": models or {}, "routing": routing}
    machine = FleetStates()
    machine.build(Fleet(config, names, names, False, False, loaded or {}, keeps=keeps))
    return machine


def check(machine: FleetStates) -> None:
    """Every invariant now, then at the end (every lease back, every wait over)."""
    try:
        machine.holds()
    except BaseException:
        machine.broken = True
        raise
    finally:
        machine.teardown()


def test_a_request_for_a_pool_of_busy_instances_waits_without_a_crash() -> None:
    """Issue 63: the starvation rule weighed an instance with a free place (here outside the
    request's pool) and placement raised ValueError on the empty set of victims there."""
    machine = started(
        [{"name": n, "models": ["m0", "m1", "m2"]} for n in ("i0", "i1")],
        {"m2": {"pools": [{"name": "only", "instances": ["i0"]}]}},
        max_wait="2s",
    )
    machine.ask("m0")  # i0 (first of the two) starts swapping m0 in
    machine.loop.settle()
    machine.ask("m2")  # its pool, i0, is busy: it waits; i1 has room but is not its
    machine.loop.settle()
    check(machine)


def test_a_model_asked_for_as_a_swap_evicts_it_is_not_served_and_unloaded() -> None:
    """A request for a warm model in the same turn of the loop as one whose swap evicts it was
    served there, then the model unloaded under it: victims close as the swap is decided."""
    machine = started([{"name": "i0", "models": ["m0", "m1"]}], loaded={"i0": ["m0"]})
    machine.ask("m1")
    machine.ask("m0")
    machine.loop.settle()
    assert machine.drivers["i0"].calls == [("unload", "m0"), ("load", "m1")]
    check(machine)


def test_room_made_outside_a_requests_pool_is_made_within_it() -> None:
    """The starvation rule closed a busy model on an instance the waiting request may not use
    (outside its pool); now it makes room where the request may go."""
    machine = started(
        [{"name": n, "models": ["m0", "m1", "m2"]} for n in ("i0", "i1")],
        {"m2": {"pools": [{"name": "only", "instances": ["i0"]}]}},
        {"i0": ["m0"], "i1": ["m1"]},
        max_wait="60s",
    )
    machine.ask("m1")  # i1's model, busy (and used first: the cheaper to close)
    machine.loop.settle()
    machine.clock.advance(1)
    machine.ask("m0")  # i0's model, busy
    machine.ask("m2")  # may use i0 only
    machine.loop.settle()
    machine.clock.advance(15)  # past its starvation point
    machine.loop.settle()
    assert machine.registry.snapshot().instance("i0").reserved_for == "m2"
    check(machine)


def test_what_a_starving_requests_swap_spares_serves_again() -> None:
    """A model closed for a starving request stayed closed once that request's swap took
    another's place; asked for again, it was swapped onto the instance it was warm on, itself
    its victim (unloaded, then loaded again)."""
    machine = started(
        [{"name": "i0", "models": ["m0", "m1", "m2"], "capacity": 2}],
        loaded={"i0": ["m0", "m1"]},
        max_wait="60s",
        min_residency=0,
    )
    held_m0 = machine.ask("m0")
    machine.loop.settle()
    machine.clock.advance(0.05)
    held_m1 = machine.ask("m1")
    machine.ask("m2")
    machine.loop.settle()
    machine.clock.advance(15)  # m0, used first, closes for m2
    machine.loop.settle()
    machine._release(held_m1)  # m2's swap takes m1's place, not m0's
    machine.loop.settle()
    machine.drivers["i0"].finish("m2")
    machine.loop.settle()
    machine._release(held_m0)
    machine.ask("m0")
    machine.loop.settle()
    assert machine.drivers["i0"].calls == [("unload", "m1"), ("load", "m2")]
    check(machine)


def test_an_instance_back_mid_swap_keeps_what_it_reports_warm() -> None:
    """An instance that went down and answered again while a swap ran kept nothing warm but
    what that swap loaded (its answer was dropped mid-swap): the next swap loaded a third
    model onto a backend of capacity two."""
    machine = started(
        [{"name": "i0", "models": ["m0", "m1", "m2"], "capacity": 2}],
        loaded={"i0": ["m0"]},
        max_wait="60s",
        min_residency=0,
    )
    machine.ask("m0")  # served, held
    machine.ask("m1")  # a free place: its swap starts
    machine.loop.settle()
    driver = machine.drivers["i0"]
    driver.down = True
    for _ in range(DOWN_AFTER):
        machine.loop.run_until_complete(machine.poller.poll("i0"))
    driver.down = False
    machine.loop.run_until_complete(machine.poller.poll("i0"))  # back, m1 still loading
    driver.finish("m1")
    machine.loop.settle()
    machine.ask("m2")
    machine.loop.settle()
    assert machine.registry.snapshot().instance("i0").state_of("m0") is WarmState.WARM
    check(machine)


def test_a_swap_measured_at_zero_seconds_does_not_break_demand_eviction() -> None:
    """A load that took no measurable time made a victim's horizon 0 s, and the chance of its
    return divided by zero when it was asked for at that instant too."""
    machine = started([{"name": "i0", "models": ["m0", "m1"]}], eviction="demand", min_residency=0)
    first = machine.ask("m0")
    machine.loop.settle()
    machine.drivers["i0"].finish("m0")  # at once: measured at 0 s
    machine.loop.settle()
    machine._release(first)
    machine.ask("m1")  # m0 weighed as a victim the instant it was last asked for
    machine.loop.settle()
    check(machine)


def test_a_preload_does_not_pin_a_model_as_it_leaves() -> None:
    """A preload that ended as a swap evicted its model counted the model warm there and pinned
    it, and the swap then unloaded a pinned model (and the preload said it was warm)."""
    machine = started(
        [{"name": "i0", "models": ["m0", "m1"]}, {"name": "i1", "models": ["m0", "m2"]}],
        loaded={"i0": ["m0"], "i1": ["m2"]},
        min_residency=0,
        swap_timeout="5s",
        max_wait="60s",
    )
    machine.ask("m2")  # i1 busy: a second copy of m0 finds no room
    machine.loop.settle()
    preload = machine.loop.create_task(machine.preloader.preload("m0", 2, pin_for=30))
    machine.preloads.append(preload)
    machine.loop.settle()
    machine.ask("m1")  # its swap evicts m0 from i0 ...
    machine.clock.advance(6)  # ... in the turn the preload's swap_timeout passes
    machine.loop.settle()
    assert preload.result().instances == ()
    check(machine)


KEEPS = {"dir": f"{KV_DIR}/i0", "save_timeout": SAVE_TIMEOUT}


def test_a_conversation_is_saved_before_its_model_leaves_and_restored_when_it_returns() -> None:
    """On a kv_keep instance the victim stays loaded until its slots are saved; the turn that
    brings it back gets its conversation restored."""
    machine = started(
        [{"name": "i0", "models": ["m0", "m1"], "kv_keep": KEEPS}],
        loaded={"i0": ["m0"]},
        min_residency=0,
        max_wait="60s",
    )
    first = machine.ask("m0", client="agent-1")
    machine.loop.settle()
    assert first.claim is not None, "a turn on a kv_keep instance goes to a slot"
    machine._release(first)
    machine.loop.settle()
    machine.ask("m1")
    machine.loop.settle()
    machine.clock.advance(1)
    machine.loop.settle()
    driver, engines = machine.drivers["i0"], machine.engines
    # Its two conversations (agent-1's and one from before) are saved one after the other
    for _ in range(2):
        assert driver.calls == [], "m0 unloaded before its conversations were saved"
        (saving,) = engines.saving
        engines.end(saving, written=True)
        machine.loop.settle()
    assert driver.calls == [("unload", "m0"), ("load", "m1")]
    driver.finish("m1")
    machine.loop.settle()
    for request in machine._held():
        machine._release(request)
    back = machine.ask("m0", client="agent-1")
    machine.loop.settle()
    for saving in list(engines.saving):  # m1's turn, left to save_timeout
        assert saving[:2] == ("i0", "m1")
    machine.clock.advance(SAVE_TIMEOUT)
    machine.loop.settle()
    driver.finish("m0")
    machine.loop.settle()
    assert _leased(back.task)
    assert [(i, m) for i, m, _ in engines.restored] == [("i0", "m0")]
    (restored,) = [name for _, _, name in engines.restored]
    assert restored in [name for _, _, name in engines.saved]
    assert "earlier" not in restored
    check(machine)


def test_a_failing_models_probe_saves_its_victims_conversations_first() -> None:
    """The probe of a model that failed to load evicts an idle model from a kv_keep instance:
    its conversations are saved first, and the probe is still the one load of it."""
    machine = started(
        [{"name": "i0", "models": ["m0", "m1"], "kv_keep": KEEPS}],
        loaded={"i0": ["m0"]},
        min_residency=0,
        max_wait="60s",
    )
    driver, engines = machine.drivers["i0"], machine.engines
    for _ in range(2):  # m1 fails twice with the same words, past its backoff: failing
        machine.ask("m1")
        machine.loop.settle()
        for saving in list(engines.saving):
            engines.end(saving, written=True)
        machine.loop.settle()
        driver.finish("m1", DriverError("the engine exited while loading"))
        machine.loop.settle()
        machine.clock.advance(backoff.FIRST)
    assert machine.registry.failing.of("m1") is not None
    served = machine.ask("m0", client="agent-1")
    machine.loop.settle()
    driver.finish("m0")
    machine.loop.settle()
    machine._release(served)
    machine.clock.advance(backoff.probe_delay(1))
    machine.loop.settle()
    machine.ask("m1")  # its probe: m0 is idle
    machine.loop.settle()
    assert [w[:2] for w in engines.saving] == [("i0", "m0")]
    machine.clock.advance(1)
    machine.loop.settle()
    engines.end(next(iter(engines.saving)), written=True)
    machine.loop.settle()
    assert driver.calls[-2:] == [("unload", "m0"), ("load", "m1")]
    check(machine)
