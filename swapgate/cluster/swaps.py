"""A replica among others (docs/deploy.md): its swaps claimed cluster-wide, the others' applied
here.

``SharedClaims`` is what the swap coordinator of a replica with a Redis asks: before a swap runs
it claims the instance and the model (swapgate/cluster/store.py); if another replica holds
either, this replica's waiters join that swap instead (its mark moves to where the other swap
runs) and the other replica's events say how it ends. What each replica tells the others:

    swap   a swap it runs began       -> the model is loading there for everyone
    done   it ended (ok, seconds)     -> warm (or cold, in backoff); its time feeds every ETA
    evict  a model it unloaded        -> cold for everyone
    pin / drain                       -> an operator's pins and drains, also kept in Redis
    down   an instance refused it     -> down for everyone, until a poll finds it back
    beat   every HEARTBEAT            -> its in-flight requests per instance and model

A swap seen from here whose holder dies sends no ``done``: every ``RECHECK`` the replica asks
Redis whether its lock is still held, and once it is not, the mark goes and the waiters place
again (one of them claims the swap and drives the load). With Redis down the marks go at once:
each replica swaps on its own, under its own single flight, until Redis returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from swapgate.cluster.locks import Holder
from swapgate.cluster.messages import (
    Beat,
    Down,
    Drained,
    Event,
    Evicted,
    Heard,
    Pinned,
    SwapDone,
    SwapStarted,
)
from swapgate.cluster.store import Listener
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.times import SwapTimes
from swapgate.errors import shown_to_clients
from swapgate.policy.backoff import Blame
from swapgate.tasks import TaskSet, stop

log = logging.getLogger("swapgate.cluster")
RECHECK = 1.0  # how often the holders of swaps seen from here are checked for life


class Locks(Protocol):
    """The swap locks replicas share: swapgate/cluster/locks.py's ``SwapLocks``, or a fake."""

    async def claim(self, instance: str, model: str) -> Holder | None: ...
    async def release(self, instance: str) -> None: ...
    async def holder(self, instance: str) -> Holder | bool | None: ...


class Replicas(Protocol):
    """What a replica asks of the shared state: swapgate/cluster/store.py's ``Cluster``, or the
    unit tests' fake."""

    replica: str  # this replica's name, as its claims and events carry it

    @property
    def locks(self) -> Locks:
        """Each swap's, across replicas (swapgate/cluster/locks.py)."""

    async def start(self, listener: Listener) -> None: ...
    async def aclose(self) -> None: ...
    async def publish(self, event: Event) -> bool: ...
    async def share(self, key: str, field: str, value: str | None) -> bool: ...
    async def shared(self, key: str) -> dict[str, str]: ...
    async def leads(self) -> bool: ...


class SharedClaims:
    """The ``Claims`` of a replica among others (swapgate/control/swaps/claims.py), and the
    listener that applies the others' events here. Made before the coordinator, which is
    given it."""

    abandons = False  # the requests other replicas hand to a swap here are not counted here

    def __init__(
        self, registry: Registry, times: SwapTimes, cluster: Replicas, shares: OperatorShares
    ) -> None:
        """``shares``: the same that tells ``registry``'s pins and drains to the others."""
        self._registry = registry
        self.times = times
        self.cluster = cluster
        self._shares = shares
        self._own: set[str] = set()  # instances where a swap of this replica's runs
        self._marks: dict[str, str] = {}  # instance -> model another replica is swapping there
        self._releasing: set[asyncio.Future[None]] = set()  # its locks on their way back
        self._tasks = TaskSet()  # events on their way to Redis
        self._recheck: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        await self.cluster.start(self)
        self._recheck = asyncio.create_task(self._check_marks(), name="cluster marks")

    async def aclose(self) -> None:
        await stop(self._recheck)
        await self._tasks.finish()
        await self._shares.finish()
        await self.cluster.aclose()

    # -- this replica's swaps ------------------------------------------------------------------

    async def claim(self, instance: str, model: str) -> bool:
        if self._releasing:  # its own locks of swaps just ended go first: it would meet them
            await asyncio.wait(set(self._releasing))
        holder = await self.cluster.locks.claim(instance, model)
        if holder is None:
            self._own.add(instance)
            eta = self.times.eta(instance, model)
            await self.cluster.publish(SwapStarted(instance, model, eta))
            return True
        if holder.replica == self.cluster.replica:
            # Its own swap of the model, elsewhere: running (its waiters see it here), or
            # ended while this claim was on its way (its locks go back): nothing to join
            self._registry.swap_marks.end_swap(instance, model, ok=False)
            return False
        log.info(
            "%s on %s: replica %s swaps %s on %s; its waiters here join that swap",
            model,
            instance,
            holder.replica,
            holder.model,
            holder.instance,
        )
        # This mark goes, without backoff
        self._registry.swap_marks.end_swap(instance, model, ok=False)
        self._mark(holder.instance, holder.model, own=instance)
        return False

    async def released(self, instance: str, model: str) -> None:
        self._own.discard(instance)
        view = self._registry.snapshot().instance(instance)
        slot = view.models.get(model)
        ok = slot is not None and slot.state == "warm"
        # The model's backoff here: the others keep it from loading there too.
        backoff = max(0.0, slot.backoff_until - self._registry.clock()) if slot else 0.0
        seconds = self.times.last(instance, model)
        failure = self._registry.failing.last(model, instance) if not ok else None
        error, blame = (failure.error, failure.blame) if failure else ("", "model")
        done = SwapDone(instance, model, ok, seconds, backoff, error, blame)
        # The locks go first, and this replica's next claims wait for them: a claim of its own
        # waiters, placed again as the swap ended, would meet them and mark a swap that nobody
        # runs any more
        releasing = asyncio.ensure_future(self.cluster.locks.release(instance))
        self._releasing.add(releasing)
        try:
            await asyncio.shield(releasing)
        finally:
            releasing.add_done_callback(self._releasing.discard)
        await self.cluster.publish(done)

    async def may_trim(self) -> bool:
        """One replica trims an instance over capacity: the one that runs scheduled preloads."""
        return await self.cluster.leads()

    def evicted(self, instance: str, model: str) -> None:
        self._tasks.spawn(self.cluster.publish(Evicted(instance, model)))

    # -- the others' -------------------------------------------------------------------------

    def apply(self, heard: Heard) -> None:
        """Another replica's event, applied to this replica's registry."""
        event = heard.event
        if isinstance(event, Beat):
            self._registry.peer_load.heard(heard.replica, event.inflight, self._registry.clock())
            return
        if not self._registry.has(event.instance):
            return  # an instance this replica's config does not have
        match event:
            case SwapStarted(instance, model, eta):
                self._mark(instance, model, eta)
            case SwapDone():
                self._done(event)
            case Evicted(instance, model):
                self._registry.swap_marks.evicted(instance, model)
            case Pinned(instance, model, until):
                self._pin(instance, model, until)
            case Drained(instance, on):
                self._registry.operator.set_drained(instance, on, share=False)
            case Down(instance):
                if self._registry.is_up(instance):
                    log.warning(
                        "instance %s is down: it refused replica %s", instance, heard.replica
                    )
                    self._registry.polls.mark_down(instance, cut=False)

    def _mark(self, instance: str, model: str, eta: float | None = None, own: str = "") -> None:
        """Another replica swaps ``model`` on ``instance``: waiters here join it. ``own``:
        the instance whose swap here is handing over (its task is ending)."""
        if (instance in self._own and instance != own) or self._registry.swapping(instance):
            return  # its own swap there, or this one is known already
        expected = eta if eta is not None else self.times.eta(instance, model)
        self._registry.swap_marks.begin_swap(instance, model, expected)
        self._marks[instance] = model

    def _done(self, done: SwapDone) -> None:
        instance, model = done.instance, done.model
        marked = self._marks.pop(instance, None)
        if done.ok:
            self._registry.failing.succeeded(model)
        elif done.error:  # counted here too: every replica knows the model failing
            blame: Blame = "instance" if done.blame == "instance" else "model"
            self._registry.failing.failed(model, instance, done.error, blame)
        if marked is not None and marked != model:
            # A mark made as that swap's holder changed (a claim that met its lock just
            # before it ended): the swap it named is over, its waiters place again
            self._registry.swap_marks.end_swap(instance, marked, ok=False)
            marked = None
        if done.ok:
            if done.seconds > 0:
                self.times.record(instance, model, done.seconds)
            if marked == model:
                self._registry.swap_marks.end_swap(instance, model, ok=True)
            else:
                self._registry.swap_marks.warmed(instance, model)
        elif marked is not None:
            failure = shown_to_clients(done.error) or "another replica's load failed"
            self._registry.swap_marks.end_swap(
                instance, marked, False, done.backoff, failure=failure
            )

    def _unmark(self, instance: str) -> None:
        model = self._marks.pop(instance, None)
        if model is not None and self._registry.swapping(instance) == model:
            self._registry.swap_marks.end_swap(instance, model, ok=False)  # waiters place again

    async def _check_marks(self) -> None:
        """Marks whose holder is gone (died mid-swap, or Redis lost) go; waiters place again."""
        while True:
            await asyncio.sleep(RECHECK)
            for instance, model in list(self._marks.items()):
                holder = await self.cluster.locks.holder(instance)
                # Gone, or another swap holds it now: the one marked here ended unheard
                if not isinstance(holder, Holder) or holder.model != model:
                    log.info("the swap on %s seen from here has no holder any more", instance)
                    self._unmark(instance)

    # -- pins and drains -------------------------------------------------------------------------

    def _pin(self, instance: str, model: str, until: float) -> None:
        if until > time.time():
            self._registry.operator.pin(
                instance, model, _monotonic(until, self._registry.clock), share=False
            )
        else:
            self._registry.operator.unpin(instance, model, share=False)

    async def resync(self) -> None:
        """Redis answers (again): tell what it missed, then read back the pins and drains
        every replica shares."""
        await self._shares.retell()
        for field, until in (await self.cluster.shared("pins")).items():
            instance, _, model = field.partition("\t")
            if self._registry.has(instance):
                self._pin(instance, model, float(until))
        drains = await self.cluster.shared("drains")
        for name in self._registry.names():
            self._registry.operator.set_drained(name, name in drains, share=False)

    def in_flight(self) -> dict[str, dict[str, int]]:
        return self._registry.in_flight()


class OperatorShares:
    """Tells the other replicas of the pins and drains an operator set on this one
    (swapgate/control/state/registry.py's ``Shares``): kept in Redis, for replicas that start later,
    and published, for those running now."""

    def __init__(self, cluster: Replicas, clock: Callable[[], float]) -> None:
        """``clock``: the registry's, whose pins' ends are told in wall-clock time."""
        self._cluster = cluster
        self._clock = clock
        # (key, field) -> (value, event): pins and drains set while Redis did not take them
        self._untold: dict[tuple[str, str], tuple[str | None, Event]] = {}
        self._tasks = TaskSet()  # shares on their way to Redis

    def pinned(self, instance: str, model: str, until: float) -> None:
        """An operator pinned ``model`` here until ``until`` (monotonic; 0: unpinned)."""
        wall = _wall(until, self._clock) if until else 0.0
        field, stored = f"{instance}\t{model}", str(wall) if wall else None
        self._tasks.spawn(self._tell_others("pins", field, stored, Pinned(instance, model, wall)))

    def drained(self, instance: str, on: bool) -> None:
        """An operator drained ``instance`` here (or undrained it)."""
        self._tasks.spawn(
            self._tell_others("drains", instance, "1" if on else None, Drained(instance, on))
        )

    def down(self, instance: str) -> None:
        """``instance`` refused a connection here: the others mark it down too (not kept:
        a replica that starts later polls it)."""
        self._tasks.spawn(self._cluster.publish(Down(instance)))

    async def retell(self) -> None:
        """Tell again what Redis did not take."""
        for (key, field), (value, event) in list(self._untold.items()):
            await self._tell_others(key, field, value, event)

    async def finish(self) -> None:
        await self._tasks.finish()

    async def _tell_others(self, key: str, field: str, value: str | None, event: Event) -> None:
        """Store an operator's pin or drain and tell the others; what Redis did not take is
        kept (the latest per pin or drain) and told again once it answers."""
        stored = await self._cluster.share(key, field, value)
        told = await self._cluster.publish(event)
        if stored and told:
            self._untold.pop((key, field), None)
        else:
            self._untold[key, field] = (value, event)


def _wall(monotonic: float, clock: Callable[[], float]) -> float:
    return monotonic - clock() + time.time()


def _monotonic(wall: float, clock: Callable[[], float]) -> float:
    return wall - time.time() + clock()
