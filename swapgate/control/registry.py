"""Live warm state per instance, in-flight counts, and immutable snapshots for placement.

The registry is the only place that mutates this state, held in parts that each keep one kind:
per instance an ``InstanceSlot`` (warm state, swap, counts, pins, drain, the room kept for a
starving request: swapgate/control/slots.py), the ``waitlist`` (arrivals and the requests
queued now), ``elsewhere`` (the other replicas' requests in flight) and the change signal the
waiters wait on. Placement reads frozen ``Snapshot``s; the swap coordinator, the poller and the
data plane call the registry's small verbs. Every change that can unblock a waiting request
wakes the waiters, who then place again. Who is told of what happens here is given at
construction: ``on_arrival`` (the demand by time of day) and ``shares`` (the other replicas).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

from swapgate.config.catalog import Catalog
from swapgate.config.settings import InstanceConfig
from swapgate.control.changes import Changes
from swapgate.control.peer_load import Elsewhere
from swapgate.control.queues import Waitlist
from swapgate.control.slots import LEAVING, InstanceSlot
from swapgate.data.lease import Pulse
from swapgate.data.snapshot import Snapshot
from swapgate.data.warm import InstanceReport, WarmState


class Shares(Protocol):
    """Told of what an operator set on this replica, for the others: a pin until ``until``
    (monotonic; 0: unpinned), a drain on or off. Implemented in swapgate/cluster/swaps.py,
    which control/ does not import (the arrows point from cluster/ to control/)."""

    def pinned(self, instance: str, model: str, until: float) -> None: ...
    def drained(self, instance: str, on: bool) -> None: ...


class Registry:
    def __init__(
        self,
        instances: Iterable[InstanceConfig],
        catalog: Catalog,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_arrival: Callable[[str], None] | None = None,
        shares: Shares | None = None,
    ) -> None:
        """``on_arrival``: told of every request's arrival (the demand by time of day);
        ``shares``: told of the pins and drains an operator sets here, for the other replicas."""
        self._catalog = catalog
        self.clock = clock  # the one clock of the live state: whatever reads it, reads this
        self._instances = {
            conf.name: self._slot(conf, _configured_models(conf, catalog)) for conf in instances
        }
        self._known: frozenset[str] | None = None
        self.waitlist = Waitlist(clock, on_arrival)  # arrivals, and the requests waiting now
        self._changes = Changes()
        self.elsewhere = Elsewhere()  # other replicas' requests in flight (their heartbeats)
        self._shares = shares

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        now = self.clock()
        elsewhere, estimates = self.elsewhere, self._catalog.sizes
        return Snapshot(
            now,
            tuple(i.view(now, estimates, elsewhere.on(n)) for n, i in self._instances.items()),
            self.waitlist.arrivals(),
            self.waitlist.oldest(),
            self.waitlist.classes(),
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

    def up_names(self) -> list[str]:
        return [name for name, inst in self._instances.items() if inst.up]

    def ready(self) -> bool:
        return bool(self.up_names())

    # -- waiting -------------------------------------------------------------------------------

    async def wait_for_change(self, timeout: float) -> None:
        """Return when the state changed in a way that may unblock a waiter, or at ``timeout``."""
        await self._changes.wait(timeout)

    def _notify(self) -> None:
        self._changes.notify()

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
        for upstream, why in (report.unreachable or {}).items():  # down alone, even mid-swap
            inst.slot(self._catalog.client_name(name, upstream)).down = why
        self._notify()

    def _apply_running(self, inst: InstanceSlot, report: InstanceReport) -> None:
        now = self.clock()
        if report.all_warm:
            running = dict.fromkeys(inst.serves, WarmState.WARM)
        elif report.running is not None:
            name = inst.config.name
            running = {self._catalog.client_name(name, u): s for u, s in report.running.items()}
        else:
            return  # the backend cannot tell; swapgate's own record stands
        for model, state in running.items():
            slot = inst.slot(model)
            slot.set_state(state, now)
            if slot.down:  # its server is back: served at once, its backoff lifted
                slot.down, slot.backoff_until, slot.failure = "", 0.0, ""
        for model, slot in inst.slots.items():
            if model not in running:
                slot.set_state(WarmState.COLD, now)

    def mark_down(self, name: str) -> None:
        """Out of placement until a poll succeeds; what it had warm is unknown from now on."""
        inst = self._instances[name]
        now = self.clock()
        inst.up = False
        inst.generation += 1
        for slot in inst.slots.values():
            slot.set_state(WarmState.COLD, now)
        self._notify()

    # -- swaps ---------------------------------------------------------------------------------

    def begin_swap(self, name: str, model: str, eta: float) -> None:
        inst = self._instances[name]
        now = self.clock()
        inst.swapping, inst.swap_done_by = model, now + eta
        inst.reserved_for, inst.reserved_until = None, 0.0
        inst.generation += 1
        inst.slot(model).set_state(WarmState.LOADING, now)
        self._notify()

    def evicted(self, name: str, model: str, to: WarmState = WarmState.COLD) -> None:
        """``model`` left ``name``: cold, or asleep where the backend keeps it (vLLM)."""
        inst = self._instances[name]
        inst.generation += 1
        inst.slot(model).set_state(to, self.clock())

    def leaving(self, name: str, models: tuple[str, ...]) -> None:
        """``models`` are being evicted from ``name``: no new requests for them go there (they
        queue for the next swap) until the eviction ends (``stayed``)."""
        if not models:
            return
        inst = self._instances[name]
        for model in models:
            inst.slot(model).closing_until = LEAVING
        self._notify()

    def stayed(self, name: str) -> None:
        """The evictions on ``name`` ended: a model still warm (its eviction failed) serves."""
        inst = self._instances.get(name)
        if inst is None:
            return
        for slot in inst.slots.values():
            if slot.closing_until == LEAVING:
                slot.closing_until = 0.0
        self._notify()

    def warmed(self, name: str, model: str) -> None:
        """``model`` is warm on ``name``: another replica's swap made it so."""
        inst = self._instances[name]
        now = self.clock()
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

    def warm_since(self, name: str, model: str) -> float | None:
        """When ``model`` last became warm on ``name`` (its load), if it is warm."""
        inst = self._instances.get(name)
        slot = inst.slots.get(model) if inst is not None else None
        return slot.since if slot is not None and slot.state is WarmState.WARM else None

    def serving(self, name: str) -> bool:
        """Whether ``name`` has requests in flight (this replica's)."""
        inst = self._instances.get(name)
        return inst is not None and inst.inflight > 0

    def progressing(self, name: str, since: float) -> bool:
        """Whether ``name`` has requests in flight whose answers moved since ``since``
        (monotonic)."""
        inst = self._instances.get(name)
        return inst is not None and inst.inflight > 0 and inst.pulse.last >= since

    def swapping_anywhere(self) -> bool:
        """Whether a swap runs on any instance (safe to ask from another thread)."""
        return any(inst.swapping is not None for inst in list(self._instances.values()))

    def swapping(self, name: str) -> str | None:
        return self._instances[name].swapping

    def in_flight(self) -> dict[str, dict[str, int]]:
        """This replica's own in-flight requests, per instance and model (for the others)."""
        return {
            name: {model: slot.inflight for model, slot in inst.slots.items() if slot.inflight}
            for name, inst in self._instances.items()
            if inst.inflight
        }

    def end_swap(
        self,
        name: str,
        model: str,
        ok: bool,
        backoff: float = 0.0,
        *,
        whole: float = 0.0,
        failure: str = "",
    ) -> None:
        """The swap on ``name`` ended. A failed one keeps ``model`` from loading there for
        ``backoff`` s (``failure``: why, as clients may read it), and the whole instance out of
        placement for ``whole`` s (swapgate/policy/backoff.py)."""
        inst = self._instances[name]
        now = self.clock()
        inst.swapping = None
        inst.generation += 1
        slot = inst.slot(model)
        if ok:
            slot.set_state(WarmState.WARM, now)
            slot.last_used = now  # its waiters are about to use it: not a victim yet
            slot.backoff_until, slot.failure = 0.0, ""
        else:
            slot.set_state(WarmState.COLD, now)
            if backoff:
                slot.backoff_until, slot.failure = now + backoff, failure
            if whole:
                inst.backoff_until = now + whole
        self._notify()

    # -- requests ------------------------------------------------------------------------------

    def begin_request(self, name: str, model: str, priority: int = 0) -> None:
        inst = self._instances[name]
        slot = inst.slot(model)
        now = self.clock()
        inst.inflight += 1
        slot.inflight += 1
        slot.classes[priority] = slot.classes.get(priority, 0) + 1
        slot.last_used = now
        slot.unwanted = False

    def end_request(self, name: str, model: str, priority: int = 0) -> None:
        inst = self._instances.get(name)
        if inst is None:
            return  # removed by a reload while this request ran
        slot = inst.slot(model)
        # max(): a reload that replaced the instance (new URL or kind) started it from zero.
        inst.inflight = max(0, inst.inflight - 1)
        slot.inflight = max(0, slot.inflight - 1)
        left = slot.classes.get(priority, 0) - 1
        if left > 0:
            slot.classes[priority] = left
        else:
            slot.classes.pop(priority, None)
        slot.last_used = self.clock()
        self._notify()

    def limited(self, name: str, model: str, keep: float) -> int:
        """``name`` refused a request for ``model`` for its own concurrency limit (a 429, the
        caller's request still counted in flight): it takes no more than the others in flight
        there (at least one) for ``keep`` seconds. Returns how many others are in flight."""
        inst = self._instances.get(name)
        if inst is None:
            return 0
        slot = inst.slot(model)
        others = max(0, slot.inflight - 1)
        now = self.clock()
        learned = slot.limit if slot.limit is not None and slot.limit_until > now else None
        slot.limit = max(1, min(others, learned) if learned is not None else others)
        slot.limit_until = now + keep
        return others

    def wait_on(self, name: str, model: str, delta: int, *, for_slot: bool = False) -> None:
        """Count a request waiting for ``model``'s swap on ``name`` (+1) or no longer (-1);
        ``for_slot``: for a free slot of it, warm (``max_concurrency``)."""
        inst = self._instances.get(name)
        if inst is not None:
            slot = inst.slot(model)
            slot.waiting += delta
            slot.for_slot += delta if for_slot else 0

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
        for other, depth in self.waitlist.depths().items():
            if other == model or other not in inst.serves:
                continue
            joined = sum(
                i.slots[other].waiting for i in self._instances.values() if other in i.slots
            )
            if depth > joined:
                return True
        return False

    def mark_abandoned(self, name: str, model: str) -> None:
        """``model``, just loaded on ``name``, was abandoned by its every request: it goes first
        when room is needed, whatever its residency."""
        inst = self._instances.get(name)
        if inst is not None:
            inst.slot(model).unwanted = True

    def reserve(self, name: str, models: tuple[str, ...], until: float, room_for: str) -> None:
        """Send no new requests to ``models`` on ``name`` until ``until``, so that they drain
        and make room for ``room_for``, whose request has waited too long (the starvation rule).
        The room is ``room_for``'s: no other model may swap onto ``name`` meanwhile."""
        inst = self._instances[name]
        for model in models:
            inst.slot(model).closing_until = until
        inst.reserved_for, inst.reserved_until = room_for, until
        self._notify()

    def unreserve(self, name: str, room_for: str) -> None:
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
        if share and self._shares is not None:
            self._shares.pinned(name, model, slot.pinned_until)

    def unpin(self, name: str, model: str, *, share: bool = True) -> None:
        self._instances[name].slot(model).pinned_until = 0.0
        if share and self._shares is not None:
            self._shares.pinned(name, model, 0.0)

    def set_drained(self, name: str, drained: bool, *, share: bool = True) -> None:
        self._instances[name].drained = drained
        self._notify()
        if share and self._shares is not None:
            self._shares.drained(name, drained)

    def has(self, name: str) -> bool:
        return name in self._instances

    def reconfigure(self, instances: Iterable[InstanceConfig], catalog: Catalog) -> None:
        """Take a reloaded config: instances that stay keep their warm state and counts."""
        self._catalog = catalog
        kept: dict[str, InstanceSlot] = {}
        for conf in instances:
            inst = self._instances.get(conf.name) or self._slot(conf, frozenset())
            if inst.config.url != conf.url or inst.config.kind != conf.kind:
                inst = self._slot(conf, frozenset())  # another server: nothing known about it
            inst.config = conf
            if conf.models is not None or not inst.serves:
                inst.serves = _configured_models(conf, catalog)
            kept[conf.name] = inst
        self._instances = kept
        self._known = None
        self._notify()

    def _slot(self, conf: InstanceConfig, serves: frozenset[str]) -> InstanceSlot:
        return InstanceSlot(conf, serves, pulse=Pulse(self.clock))


def _configured_models(conf: InstanceConfig, catalog: Catalog) -> frozenset[str]:
    return frozenset(catalog.resolve(m) for m in conf.models or ())
