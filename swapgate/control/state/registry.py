"""Live warm state per instance, in-flight counts, and immutable snapshots for placement.

The registry owns the live state (swapgate/control/state/live_state.py: per instance an
``InstanceSlot`` with its warm state, swap, counts, pins, drain and the room kept for a starving
request; the ``queues`` of arrivals and of the requests waiting now; the change signal) and
answers what it holds: placement reads frozen ``Snapshot``s. What changes it comes in parts, one
per caller: ``polls`` (the poller), ``swap_marks`` (the swap coordinator), ``traffic`` (the data
plane and the router) and ``operator`` (the admin API and the other replicas). Every change
that can unblock a waiting request wakes the waiters, who then place again. Who is told of what
happens here is given at construction: ``on_arrival`` (the demand by time of day) and
``shares`` (the other replicas). ``copies`` says where each model is warm, loading or asleep,
kept in step with every change, so that a request looks its model up instead of viewing the
whole fleet (``snapshot(only=...)``: the views of those instances alone).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from swapgate.config.catalog import Catalog
from swapgate.config.settings import InstanceConfig
from swapgate.control.faults.failing import FailingModels
from swapgate.control.faults.hangups import Hangups
from swapgate.control.state.changes import Changes
from swapgate.control.state.clients import Clients
from swapgate.control.state.copies import Copies
from swapgate.control.state.live_state import LiveState
from swapgate.control.state.operator_marks import OperatorMarks, Shares
from swapgate.control.state.peer_load import PeerLoad
from swapgate.control.state.polls import PollResults
from swapgate.control.state.queues import Queues
from swapgate.control.state.slots import InstanceSlot
from swapgate.control.state.swap_marks import SwapMarks
from swapgate.control.state.traffic import Traffic
from swapgate.data.lease import Pulse
from swapgate.data.snapshot import Snapshot
from swapgate.data.warm import WarmState


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
        self.clock = clock  # the one clock of the live state: whatever reads it, reads this
        self.changes = Changes(clock)  # what waiting requests and preloads wait on
        self.queues = Queues(clock, on_arrival)  # arrivals, and the requests waiting now
        self.clients = Clients(clock)  # who sends them: closed loops (agents) and the rest
        self.peer_load = PeerLoad()  # other replicas' requests in flight (their heartbeats)
        self.failing = FailingModels(
            clock
        )  # models whose loads fail fleet-wide (control/faults/failing.py)
        # Where each model is warm, loading or asleep: what a request looks up (copies.py)
        self.copies = Copies()
        slots = {
            conf.name: self._slot(conf, _configured_models(conf, catalog)) for conf in instances
        }
        self.copies.rebuild(slots)
        self._live = LiveState(slots, catalog, clock, self.changes, self.queues)
        self.hangups = Hangups()  # requests waiting on an instance for its first byte
        self.polls = PollResults(self._live, self.hangups, shares)
        self.swap_marks = SwapMarks(self._live)
        self.traffic = Traffic(self._live)
        self.operator = OperatorMarks(self._live, shares)

    def snapshot(self, only: Iterable[str] | None = None) -> Snapshot:
        """Every instance as placement sees it now; with ``only``, those of these names alone
        (a name the registry does not hold is left out), in the order given."""
        now, live = self.clock(), self._live
        estimates = live.catalog.sizes
        queued = self.queues.oldest()
        every = live.instances
        chosen = every.items() if only is None else ((n, every[n]) for n in only if n in every)
        return Snapshot(
            now,
            tuple(i.view(now, estimates, self.peer_load.on(n)) for n, i in chosen),
            self.queues.arrivals(),
            queued,
            self.queues.classes(),
            self.clients.unheld() if queued else frozenset(),  # it matters only to a queue
        )

    def names(self) -> list[str]:
        return list(self._live.instances)

    def known_models(self) -> frozenset[str]:
        """Every model some instance serves or the config names; asked on every request, so
        kept until a poll or a reload changes what the instances serve."""
        live = self._live
        if live.known is None:
            served = (inst.serves for inst in live.instances.values())
            live.known = live.catalog.configured.union(*served)
        return live.known

    def instances_of(self, model: str) -> list[str]:
        """The instances that serve ``model`` (configured, or discovered on them); asked on
        requests, so kept until a poll or a reload changes what the instances serve."""
        live = self._live
        if live.serving is None:
            live.serving = {}
            for name, inst in live.instances.items():
                for served in inst.serves:
                    live.serving.setdefault(served, []).append(name)
        return list(live.serving.get(model, ()))

    def is_up(self, name: str) -> bool:
        return self._live.instances[name].up

    def generation(self, name: str) -> int:
        return self._live.instances[name].generation

    def up_names(self) -> list[str]:
        return [name for name, inst in self._live.instances.items() if inst.up]

    def sizes(self, name: str) -> dict[str, dict[str, int | str]]:
        """Per model on ``name``: its estimated (declared or computed), learned and measured
        size where known, how the measured one was read, and the one placement counts."""
        inst = self._live.instances[name]
        known: dict[str, dict[str, int | str]] = {
            m: {"estimate": b} for m, b in self._live.catalog.sizes.items() if m in inst.serves
        }
        for model, learned in inst.learned.items():
            known.setdefault(model, {})["learned"] = learned
        for model, figure in inst.measured.items():
            known.setdefault(model, {}).update(measured=figure.bytes, measured_by=figure.source)
        if inst.config.memory is not None:  # what placement counts; nothing without a limit
            counted = inst.sizes(self._live.catalog.sizes)
            for model, sizes in known.items():
                sizes["placed_by"] = counted.get(model, 0)
        return known

    def pulse(self, name: str) -> Pulse:
        """The beat of ``name``'s answers, which the data plane keeps as their bytes arrive."""
        return self._live.instances[name].pulse

    def warm_since(self, name: str, model: str) -> float | None:
        """When ``model`` last became warm on ``name`` (its load), if it is warm."""
        inst = self._live.instances.get(name)
        slot = inst.slots.get(model) if inst is not None else None
        return slot.since if slot is not None and slot.state is WarmState.WARM else None

    def serving(self, name: str) -> bool:
        """Whether ``name`` has requests in flight (this replica's)."""
        inst = self._live.instances.get(name)
        return inst is not None and inst.inflight > 0

    def progressing(self, name: str, since: float) -> bool:
        """Whether ``name`` has requests in flight whose answers moved since ``since``
        (monotonic)."""
        inst = self._live.instances.get(name)
        return inst is not None and inst.inflight > 0 and inst.pulse.last >= since

    def swapping_anywhere(self) -> bool:
        """Whether a swap runs on any instance (safe to ask from another thread)."""
        return any(inst.swapping is not None for inst in list(self._live.instances.values()))

    def swapping(self, name: str) -> str | None:
        return self._live.instances[name].swapping

    def in_flight(self) -> dict[str, dict[str, int]]:
        """This replica's own in-flight requests, per instance and model (for the others)."""
        return {
            name: {model: slot.inflight for model, slot in inst.slots.items() if slot.inflight}
            for name, inst in self._live.instances.items()
            if inst.inflight
        }

    def has(self, name: str) -> bool:
        return name in self._live.instances

    def reconfigure(self, instances: Iterable[InstanceConfig], catalog: Catalog) -> None:
        """Take a reloaded config: instances that stay keep their warm state and counts."""
        self._live.catalog = catalog
        kept: dict[str, InstanceSlot] = {}
        for conf in instances:
            inst = self._live.instances.get(conf.name) or self._slot(conf, frozenset())
            if inst.config.url != conf.url or inst.config.kind != conf.kind:
                inst = self._slot(conf, frozenset())  # another server: nothing known about it
            inst.config = conf
            if conf.models is not None or not inst.serves:
                inst.serves = _configured_models(conf, catalog)
            kept[conf.name] = inst
        self._live.instances = kept
        self.copies.rebuild(kept)
        self._live.served_changed()
        self._live.changes.notify()

    def _slot(self, conf: InstanceConfig, serves: frozenset[str]) -> InstanceSlot:
        return InstanceSlot(conf, serves, pulse=Pulse(self.clock), copies=self.copies)


def _configured_models(conf: InstanceConfig, catalog: Catalog) -> frozenset[str]:
    return frozenset(catalog.resolve(m) for m in conf.models or ())
