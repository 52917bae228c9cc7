"""What the poller tells the registry: an instance's answer to a poll, or that it is down."""

from __future__ import annotations

from swapgate.control.state.live_state import LiveState
from swapgate.control.state.slots import InstanceSlot
from swapgate.data.warm import InstanceReport, WarmState


class PollResults:
    def __init__(self, live: LiveState) -> None:
        self._live = live

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
        inst.up = True
        inst.reported_capacity = report.capacity
        if report.sizes:
            inst.learned.update((live.client_name(name, u), b) for u, b in report.sizes.items())
        if inst.generation == generation:
            # Mid-swap too: an instance back from down has nothing known warm but its answer
            self._apply_running(inst, report, besides=inst.swapping)
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

    def mark_down(self, name: str) -> None:
        """Out of placement until a poll succeeds; what it had warm is unknown from now on."""
        inst = self._live.instances[name]
        now = self._live.clock()
        inst.up = False
        inst.generation += 1
        for slot in inst.slots.values():
            slot.set_state(WarmState.COLD, now)
        self._live.changes.notify()
