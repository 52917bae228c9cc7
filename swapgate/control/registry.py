"""Live warm state per instance, in-flight counts, and immutable snapshots for placement.

The registry is the only place that mutates this state. Placement reads frozen ``Snapshot``s;
the swap coordinator, the poller and the data plane call the registry's small verbs. Every change
that can unblock a waiting request wakes the waiters, who then place again.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from swapgate.config.catalog import Catalog
from swapgate.config.settings import InstanceConfig
from swapgate.model.demand import Arrivals
from swapgate.model.lease import Pulse
from swapgate.model.snapshot import InstanceView, ModelView, Snapshot
from swapgate.model.state import InstanceReport, WarmState

# ``closing_until`` of a model being evicted: no new request goes to it until it is gone.
LEAVING = float("inf")
REPLICA_TTL = 3.0  # a replica unheard this long has nothing in flight any more (docs/deploy.md)
NO_COUNT_LIMIT = 1 << 30  # an instance whose memory alone limits what is resident


@dataclass(slots=True)
class _Slot:
    state: WarmState = WarmState.COLD
    since: float = 0.0
    last_used: float = 0.0
    inflight: int = 0
    pinned_until: float = 0.0
    waiting: int = 0
    closing_until: float = 0.0
    unwanted: bool = False  # loaded by a swap abandoned by every request: the first victim

    def set_state(self, state: WarmState, now: float) -> None:
        if self.state is not state:
            self.state, self.since = state, now
            self.closing_until = 0.0
            self.unwanted = False

    def view(self, now: float, elsewhere: int = 0) -> ModelView:
        return ModelView(
            self.state, self.since, self.last_used, self.inflight + elsewhere, self.pinned_until,
            self.waiting, self.closing_until > now, self.unwanted,
        )  # fmt: skip


@dataclass(slots=True)
class _Instance:
    config: InstanceConfig
    serves: frozenset[str]
    up: bool = False
    drained: bool = False
    backoff_until: float = 0.0
    inflight: int = 0
    swapping: str | None = None
    swap_done_by: float = 0.0
    evicting: bool = False  # models leaving it (``leaving``): no swap may start meanwhile
    generation: int = 0
    reserved_for: str | None = None
    reserved_until: float = 0.0
    slots: dict[str, _Slot] = field(default_factory=dict)
    learned: dict[str, int] = field(default_factory=dict)  # sizes its backend reported
    reported_capacity: int | None = None  # what its backend said it runs at once
    pulse: Pulse = field(default_factory=Pulse)  # when its answers last moved

    @property
    def capacity(self) -> int:
        """Models resident at once by count: the config's, else what the backend reports,
        else none at all where memory alone limits (docs/memory.md)."""
        if self.reported_capacity is not None and not self.config.capacity_set:
            return self.reported_capacity
        count = self.config.count_limit
        return count if count is not None else NO_COUNT_LIMIT

    def slot(self, model: str) -> _Slot:
        return self.slots.setdefault(model, _Slot())

    def view(
        self, now: float, estimates: dict[str, int], elsewhere: dict[str, int] | None = None
    ) -> InstanceView:
        """``estimates``: the configured sizes; ``elsewhere``: what other replicas have in
        flight here, per model."""
        others = elsewhere or {}
        memory = self.config.memory
        return InstanceView(
            name=self.config.name,
            up=self.up,
            drained=self.drained,
            capacity=self.capacity,
            weight=self.config.weight,
            inflight=self.inflight + sum(others.values()),
            serves=self.serves,
            models={name: slot.view(now, others.get(name, 0)) for name, slot in self.slots.items()},
            swapping=self.swapping,
            swap_done_by=self.swap_done_by,
            backoff_until=self.backoff_until,
            reserved_for=self.reserved_for if self.reserved_until > now else None,
            memory=memory,
            evicting=self.evicting,
            sizes={**estimates, **self.learned} if memory is not None else {},
        )


class Registry:
    def __init__(
        self,
        instances: Iterable[InstanceConfig],
        catalog: Catalog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = catalog
        self._clock = clock
        self._instances = {
            conf.name: _Instance(conf, _configured_models(conf, catalog)) for conf in instances
        }
        # model -> when each queued request arrived, oldest first: snapshots read the first
        self._queued: dict[str, list[float]] = {}
        self._arrivals: dict[str, Arrivals] = {}
        self._changed = asyncio.Event()
        self._waiters = 0
        self._known: frozenset[str] | None = None
        # Other replicas' in-flight requests (docs/deploy.md): replica -> (heard at, instance ->
        # model -> count), and their sum per instance, which snapshots add to this replica's.
        self._remote: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}
        self._elsewhere: dict[str, dict[str, int]] = {}
        # Told of pins and drains an operator set here, for other replicas
        # (swapgate/cluster/shared.py)
        self.on_shared: Callable[[str, str, str, float | bool], None] | None = None
        # Told of every arrival: the demand by time of day (swapgate/control/forecast.py)
        self.on_arrival: Callable[[str], None] | None = None

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        now = self._clock()
        elsewhere, estimates = self._elsewhere, self._catalog.sizes
        return Snapshot(
            now,
            tuple(i.view(now, estimates, elsewhere.get(n)) for n, i in self._instances.items()),
            dict(self._arrivals),
            {model: since[0] for model, since in self._queued.items()},
        )

    def names(self) -> list[str]:
        return list(self._instances)

    def known_models(self) -> frozenset[str]:
        """Every model some instance serves or the config names; asked on every request, so
        kept until a poll or a reload changes what the instances serve."""
        if self._known is None:
            served = (inst.serves for inst in self._instances.values())
            self._known = self._catalog.configured.union(*served)
        return self._known

    def is_up(self, name: str) -> bool:
        return self._instances[name].up

    def generation(self, name: str) -> int:
        return self._instances[name].generation

    def queue_depths(self) -> dict[str, int]:
        return {model: len(since) for model, since in self._queued.items()}

    def up_names(self) -> list[str]:
        return [name for name, inst in self._instances.items() if inst.up]

    def ready(self) -> bool:
        return bool(self.up_names())

    # -- waiting -------------------------------------------------------------------------------

    async def wait_for_change(self, timeout: float) -> None:
        """Return when the state changed in a way that may unblock a waiter, or at ``timeout``."""
        event = self._changed
        self._waiters += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters -= 1

    def arrived(self, model: str) -> None:
        """Count a request for ``model`` in its gateway-wide arrivals, however it is served."""
        now = self._clock()
        seen = self._arrivals.get(model)
        self._arrivals[model] = seen.counted(now) if seen else Arrivals(now)
        if self.on_arrival is not None:
            self.on_arrival(model)

    @contextmanager
    def queued(self, model: str, since: float) -> Iterator[int]:
        """Count a request for ``model`` that arrived at ``since`` as queued while it waits;
        gives the queue's depth with it."""
        depth = self.enter_queue(model, since)
        try:
            yield depth
        finally:
            self.leave_queue(model, since)

    def enter_queue(self, model: str, since: float) -> int:
        """Queue a request for ``model`` that arrived at ``since``; returns the queue's depth."""
        queue = self._queued.setdefault(model, [])
        bisect.insort(queue, since)  # requests queue as they arrive: an append, nearly always
        return len(queue)

    def leave_queue(self, model: str, since: float) -> None:
        queue = self._queued[model]
        queue.remove(since)
        if not queue:  # only models with requests queued stay: snapshots iterate them
            del self._queued[model]

    def _notify(self) -> None:
        if self._waiters:
            self._changed.set()
            self._changed = asyncio.Event()

    # -- polls ---------------------------------------------------------------------------------

    def apply_report(self, name: str, report: InstanceReport, generation: int) -> None:
        """Take a poll's answer; its warm state only if no swap began or ended since it was sent."""
        inst = self._instances[name]
        if report.available is not None and inst.config.models is None:
            inst.serves = frozenset(self._catalog.client_name(name, u) for u in report.available)
            self._known = None
        inst.up = True
        inst.reported_capacity = report.capacity
        if report.sizes:
            inst.learned.update(
                (self._catalog.client_name(name, u), b) for u, b in report.sizes.items()
            )
        if inst.generation == generation and inst.swapping is None:
            self._apply_running(inst, report)
        self._notify()

    def _apply_running(self, inst: _Instance, report: InstanceReport) -> None:
        now = self._clock()
        if report.all_warm:
            running = dict.fromkeys(inst.serves, WarmState.WARM)
        elif report.running is not None:
            name = inst.config.name
            running = {self._catalog.client_name(name, u): s for u, s in report.running.items()}
        else:
            return  # the backend cannot tell; swapgate's own record stands
        for model, state in running.items():
            inst.slot(model).set_state(state, now)
        for model, slot in inst.slots.items():
            if model not in running:
                slot.set_state(WarmState.COLD, now)

    def mark_down(self, name: str) -> None:
        """Out of placement until a poll succeeds; what it had warm is unknown from now on."""
        inst = self._instances[name]
        now = self._clock()
        inst.up = False
        inst.generation += 1
        for slot in inst.slots.values():
            slot.set_state(WarmState.COLD, now)
        self._notify()

    # -- swaps ---------------------------------------------------------------------------------

    def begin_swap(self, name: str, model: str, eta: float) -> None:
        inst = self._instances[name]
        now = self._clock()
        inst.swapping, inst.swap_done_by = model, now + eta
        inst.reserved_for, inst.reserved_until = None, 0.0
        inst.generation += 1
        inst.slot(model).set_state(WarmState.LOADING, now)
        self._notify()

    def evicted(self, name: str, model: str, to: WarmState = WarmState.COLD) -> None:
        """``model`` left ``name``: cold, or asleep where the backend keeps it (vLLM)."""
        inst = self._instances[name]
        inst.generation += 1
        inst.slot(model).set_state(to, self._clock())

    def leaving(self, name: str, models: tuple[str, ...]) -> None:
        """``models`` are being evicted from ``name``: no new requests for them go there (they
        queue for the next swap) until the eviction ends (``stayed``)."""
        if not models:
            return
        inst = self._instances[name]
        inst.evicting = True
        for model in models:
            inst.slot(model).closing_until = LEAVING
        self._notify()

    def stayed(self, name: str) -> None:
        """The evictions on ``name`` ended: a model still warm (its eviction failed) serves."""
        inst = self._instances.get(name)
        if inst is None:
            return
        inst.evicting = False
        for slot in inst.slots.values():
            if slot.closing_until == LEAVING:
                slot.closing_until = 0.0
        self._notify()

    def warmed(self, name: str, model: str) -> None:
        """``model`` is warm on ``name``: another replica's swap made it so."""
        inst = self._instances[name]
        now = self._clock()
        inst.generation += 1
        slot = inst.slot(model)
        slot.set_state(WarmState.WARM, now)
        slot.last_used = max(slot.last_used, now)
        self._notify()

    def sizes(self, name: str) -> dict[str, dict[str, int]]:
        """Per model on ``name``: its estimated and its learned size, where known."""
        inst = self._instances[name]
        known = {m: {"estimate": b} for m, b in self._catalog.sizes.items() if m in inst.serves}
        for model, learned in inst.learned.items():
            known.setdefault(model, {})["learned"] = learned
        return known

    def pulse(self, name: str) -> Pulse:
        """The beat of ``name``'s answers, which the data plane keeps as their bytes arrive."""
        return self._instances[name].pulse

    def progressing(self, name: str, since: float) -> bool:
        """Whether ``name`` has requests in flight whose answers moved since ``since``
        (monotonic)."""
        inst = self._instances.get(name)
        return inst is not None and inst.inflight > 0 and inst.pulse.last >= since

    def swapping(self, name: str) -> str | None:
        return self._instances[name].swapping

    def in_flight(self) -> dict[str, dict[str, int]]:
        """This replica's own in-flight requests, per instance and model (for the others)."""
        return {
            name: {model: slot.inflight for model, slot in inst.slots.items() if slot.inflight}
            for name, inst in self._instances.items()
            if inst.inflight
        }

    def elsewhere(self, replica: str, counts: dict[str, dict[str, int]], now: float) -> None:
        """``replica`` has ``counts`` in flight; replicas unheard for ``REPLICA_TTL`` drop."""
        self._remote[replica] = (now, counts)
        total: dict[str, dict[str, int]] = {}
        for heard, seen in list(self._remote.values()):
            if now - heard > REPLICA_TTL:
                continue
            for name, models in seen.items():
                into = total.setdefault(name, {})
                for model, count in models.items():
                    into[model] = into.get(model, 0) + int(count)
        self._remote = {r: v for r, v in self._remote.items() if now - v[0] <= REPLICA_TTL}
        self._elsewhere = total

    def end_swap(self, name: str, model: str, ok: bool, backoff: float = 0.0) -> None:
        """The swap on ``name`` ended; a failed one keeps it out of placement ``backoff`` s."""
        inst = self._instances[name]
        now = self._clock()
        inst.swapping = None
        inst.generation += 1
        slot = inst.slot(model)
        if ok:
            slot.set_state(WarmState.WARM, now)
            slot.last_used = now  # its waiters are about to use it: not a victim yet
        else:
            slot.set_state(WarmState.COLD, now)
            inst.backoff_until = now + backoff
        self._notify()

    # -- requests ------------------------------------------------------------------------------

    def begin_request(self, name: str, model: str) -> None:
        inst = self._instances[name]
        slot = inst.slot(model)
        now = self._clock()
        inst.inflight += 1
        slot.inflight += 1
        slot.last_used = now
        slot.unwanted = False

    def end_request(self, name: str, model: str) -> None:
        inst = self._instances.get(name)
        if inst is None:
            return  # removed by a reload while this request ran
        slot = inst.slot(model)
        # max(): a reload that replaced the instance (new URL or kind) started it from zero.
        inst.inflight = max(0, inst.inflight - 1)
        slot.inflight = max(0, slot.inflight - 1)
        slot.last_used = self._clock()
        self._notify()

    def wait_on(self, name: str, model: str, delta: int) -> None:
        """Count a request waiting for ``model``'s swap on ``name`` (+1) or no longer (-1)."""
        inst = self._instances.get(name)
        if inst is not None:
            inst.slot(model).waiting += delta

    def waiting_on(self, name: str, model: str) -> int:
        """Requests waiting for ``model``'s swap on ``name`` (0 once a reload removed it)."""
        inst = self._instances.get(name)
        return inst.slot(model).waiting if inst is not None else 0

    def queued_behind(self, name: str, model: str) -> bool:
        """Whether another model ``name`` serves has requests queued that wait for no swap:
        requests a swap of ``model`` there keeps waiting."""
        inst = self._instances.get(name)
        if inst is None:
            return False
        for other, since in self._queued.items():
            if other == model or other not in inst.serves:
                continue
            joined = sum(
                i.slots[other].waiting for i in self._instances.values() if other in i.slots
            )
            if len(since) > joined:
                return True
        return False

    def unwanted(self, name: str, model: str) -> None:
        """``model``, just loaded on ``name``, was abandoned by its every request: it goes first
        when room is needed, whatever its residency."""
        inst = self._instances.get(name)
        if inst is not None:
            inst.slot(model).unwanted = True

    def close(self, name: str, models: tuple[str, ...], until: float, room_for: str) -> None:
        """Send no new requests to ``models`` on ``name`` until ``until``, so that they drain
        and make room for ``room_for``, whose request has waited too long (the starvation rule).
        The room is ``room_for``'s: no other model may swap onto ``name`` meanwhile."""
        inst = self._instances[name]
        for model in models:
            inst.slot(model).closing_until = until
        inst.reserved_for, inst.reserved_until = room_for, until
        self._notify()

    def reopen(self, name: str, room_for: str) -> None:
        """The request the room on ``name`` was made for no longer waits. Unless its swap has
        begun there (which takes the room), the models closed for it serve again."""
        inst = self._instances.get(name)
        if inst is None or inst.reserved_for != room_for:
            return
        inst.reserved_for, inst.reserved_until = None, 0.0
        for slot in inst.slots.values():
            if slot.closing_until != LEAVING:
                slot.closing_until = 0.0
        self._notify()

    # -- operators -----------------------------------------------------------------------------

    def pin(self, name: str, model: str, until: float, *, share: bool = True) -> None:
        """Keep ``model`` out of request-driven eviction on ``name`` until ``until`` (monotonic)."""
        slot = self._instances[name].slot(model)
        slot.pinned_until = max(slot.pinned_until, until)
        if share and self.on_shared is not None:
            self.on_shared("pin", name, model, slot.pinned_until)

    def unpin(self, name: str, model: str, *, share: bool = True) -> None:
        self._instances[name].slot(model).pinned_until = 0.0
        if share and self.on_shared is not None:
            self.on_shared("pin", name, model, 0.0)

    def set_drained(self, name: str, drained: bool, *, share: bool = True) -> None:
        self._instances[name].drained = drained
        self._notify()
        if share and self.on_shared is not None:
            self.on_shared("drain", name, "", drained)

    def has(self, name: str) -> bool:
        return name in self._instances

    def reconfigure(self, instances: Iterable[InstanceConfig], catalog: Catalog) -> None:
        """Take a reloaded config: instances that stay keep their warm state and counts."""
        self._catalog = catalog
        kept: dict[str, _Instance] = {}
        for conf in instances:
            inst = self._instances.get(conf.name) or _Instance(conf, frozenset())
            if inst.config.url != conf.url or inst.config.kind != conf.kind:
                inst = _Instance(conf, frozenset())  # another server: nothing known about it
            inst.config = conf
            if conf.models is not None or not inst.serves:
                inst.serves = _configured_models(conf, catalog)
            kept[conf.name] = inst
        self._instances = kept
        self._known = None
        self._notify()


def _configured_models(conf: InstanceConfig, catalog: Catalog) -> frozenset[str]:
    return frozenset(catalog.resolve(m) for m in conf.models or ())
