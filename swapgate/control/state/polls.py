"""What the poller tells the registry: an instance's answer to a poll, or that it is down.

A poll of a ``kind: process`` instance also reads what each ready model takes (its GPU memory,
or its process group's resident size: docs/memory.md, "Measured memory"). Per (instance, model)
the registry keeps the largest reading since the model's last load; it outlives the model's
unload, so that placement counts it when the model comes back, and the first reading of its
next load replaces it. Placement counts the larger of it and the declared or computed size
(``InstanceSlot.sizes``). A reading more than 10% above the declared size is logged once per
load, with the fix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from swapgate.config.sizes import human
from swapgate.control.faults.hangups import Hangups
from swapgate.control.state.live_state import LiveState
from swapgate.control.state.operator_marks import Shares
from swapgate.control.state.slots import InstanceSlot
from swapgate.data.footprint import WARN_ABOVE, Footprint, Measured, above_declared
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.policy import backoff

log = logging.getLogger("swapgate.memory")
faults_log = logging.getLogger("swapgate.faults")  # instances down, back, or flapping
FLAPS_KEPT = 8  # the latest times an instance went down, for its flap hold
SOURCES = {"gpu": "GPU memory its processes hold", "rss": "its process group's resident size"}


class PollResults:
    def __init__(
        self, live: LiveState, hangups: Hangups | None = None, shares: Shares | None = None
    ) -> None:
        """``hangups``: the requests waiting on an instance, ended when it goes down;
        ``shares``: told of an instance that refused a connection, for the other replicas."""
        self._live = live
        self._hangups = hangups or Hangups()
        self._shares = shares
        # Instances a failed request or poll made suspect: the poller asks them again soon
        self._suspects: dict[str, asyncio.Event] = {}

    def apply_report(self, name: str, report: InstanceReport, generation: int) -> None:
        """Take a poll's answer; its warm state only if no swap began or ended since it was sent,
        and of every model but the one a running swap loads."""
        live = self._live
        inst = live.instances[name]
        if report.available is not None and inst.config.models is None:
            serves = frozenset(live.client_name(name, u) for u in report.available)
            if serves != inst.serves:  # most polls change nothing: what is known stays
                inst.serves = serves
                live.served_changed()
        if not inst.up:
            self._back_up(inst)
        inst.up = True
        inst.reported_capacity = report.capacity
        if report.sizes:
            inst.learned.update((live.client_name(name, u), b) for u, b in report.sizes.items())
        if inst.generation == generation:
            # Mid-swap too: an instance back from down has nothing known warm but its answer
            self._apply_running(inst, report, besides=inst.swapping)
        if report.measured:  # after the warm state: a reading counts for a warm model alone
            readings = {live.client_name(name, u): f for u, f in report.measured.items()}
            _take_readings(inst, readings, live.catalog.sizes)
        for upstream, why in (report.unreachable or {}).items():  # down alone, even mid-swap
            inst.slot(live.client_name(name, upstream)).down = why
        live.changes.notify()

    def _apply_running(
        self, inst: InstanceSlot, report: InstanceReport, besides: str | None = None
    ) -> None:
        """``besides``: the model a swap loads there now, which the swap itself settles."""
        now = self._live.clock()
        if report.all_warm:
            running = dict.fromkeys(inst.serves, WarmState.WARM)
        elif report.running is not None:
            name = inst.config.name
            running = {self._live.client_name(name, u): s for u, s in report.running.items()}
        else:
            return  # the backend cannot tell; swapgate's own record stands
        for model, state in running.items():
            if model == besides:
                continue
            slot = inst.slot(model)
            slot.set_state(state, now)
            if slot.down:  # its server is back: served at once, its backoff lifted
                slot.down, slot.backoff_until, slot.failure = "", 0.0, ""
        for model, slot in inst.slots.items():
            if model not in running and model != besides:
                slot.set_state(WarmState.COLD, now)

    def measured(self) -> list[tuple[str, str, int, int | None]]:
        """Every figure measured: (instance, model, measured bytes, declared bytes or None);
        instances with none cost nothing (read at every scrape of /metrics)."""
        declared = self._live.catalog.sizes
        return [
            (name, model, figure.bytes, declared.get(model))
            for name, inst in self._live.instances.items()
            if inst.measured
            for model, figure in inst.measured.items()
        ]

    def mark_down(self, name: str, *, cut: bool = True) -> None:
        """Out of placement until a poll succeeds; what it had warm is unknown from now on.
        With ``cut`` (it stopped answering its polls: hung, perhaps), every request still
        waiting on it for its first byte ends (control/faults/hangups.py); without (it
        refused a connection: nothing listens), they fail by themselves and place again."""
        inst = self._live.instances[name]
        now = self._live.clock()
        if inst.up:
            inst.downs = [*inst.downs[-(FLAPS_KEPT - 1) :], now]
        inst.up = False
        inst.generation += 1
        for slot in inst.slots.values():
            slot.set_state(WarmState.COLD, now)
        ended = self._hangups.cut(name) if cut else 0
        if ended:
            faults_log.warning("instance %s is down: %d requests waiting on it end", name, ended)
        self._live.changes.notify()

    def refused(self, name: str) -> None:
        """``name`` refused a connection: down at once, here and on every other replica."""
        if self._live.instances[name].up and self._shares is not None:
            self._shares.down(name)
        self.mark_down(name, cut=False)

    def lost(self, name: str, *, refused: bool) -> None:
        """A request's connection to ``name`` failed: ``refused`` (nothing listens), it is down
        at once; else (closed or reset with no answer) it is polled again soon."""
        if refused:
            self.refused(name)
        else:
            self.suspect(name)

    def suspect(self, name: str) -> None:
        """A request to ``name`` failed by its connection, or a poll of it did: the poller
        asks it again soon instead of at its next interval (control/loops/poller.py)."""
        self._suspicion(name).set()

    async def suspected(self, name: str) -> None:
        """Returns once ``name`` is suspect (and is no longer, until told again)."""
        event = self._suspicion(name)
        await event.wait()
        event.clear()

    def _suspicion(self, name: str) -> asyncio.Event:
        event = self._suspects.get(name)
        if event is None:
            event = self._suspects[name] = asyncio.Event()
        return event

    def _back_up(self, inst: InstanceSlot) -> None:
        """An instance answers again: one that keeps going down is held out of placement
        for a while that grows (swapgate/policy/backoff.py)."""
        now = self._live.clock()
        hold = backoff.flap_hold(inst.downs, now)
        if hold:
            inst.backoff_until = max(inst.backoff_until, now + hold)
            faults_log.warning(
                "instance %s is back, but went down %d times lately: held out of placement "
                "for %.0fs",
                inst.config.name,
                len(inst.downs),
                hold,
            )


def _take_readings(
    inst: InstanceSlot, readings: Mapping[str, Footprint], declared: Mapping[str, int]
) -> None:
    """Keep each reading (by client model name) of a model warm on ``inst``; ``declared``: the
    config's sizes. A reading of a model the registry does not hold warm yet waits for the
    next poll: its load's end is what starts its figure."""
    for model, reading in readings.items():
        slot = inst.slots.get(model)
        if slot is None or slot.state is not WarmState.WARM:
            continue
        kept = inst.measured.get(model)
        figure = Measured(reading.bytes, reading.source, slot.since)
        if kept is not None:
            figure = kept.taken(reading, slot.since)
        inst.measured[model] = figure
        size = declared.get(model)
        if above_declared(figure.bytes, size) and inst.warned.get(model) != slot.since:
            inst.warned[model] = slot.since
            _warn(inst.config.name, model, figure, size or 0)


def _warn(instance: str, model: str, figure: Measured, declared: int) -> None:
    log.warning(
        "%s on %s takes %s (%s), more than %d%% above its declared %s: placement counts "
        "%s for it from now on; raise models.%s.memory to at least %s (or its "
        "memory_overhead, where its size is computed) so that plans and first loads count it",
        model,
        instance,
        human(figure.bytes),
        SOURCES[figure.source],
        round(WARN_ABOVE * 100),
        human(declared),
        human(figure.bytes),
        model,
        human(figure.bytes),
    )
