"""What the data plane and the router tell the registry of the requests: one begins and ends on
an instance, waits for a swap there, or was refused for the engine's own concurrency limit."""

from __future__ import annotations

from swapgate.control.state.live_state import LiveState


class Traffic:
    def __init__(self, live: LiveState) -> None:
        self._live = live

    def begin_request(self, name: str, model: str, priority: int = 0) -> None:
        inst = self._live.instances[name]
        slot = inst.slot(model)
        now = self._live.clock()
        inst.inflight += 1
        slot.inflight += 1
        slot.classes[priority] = slot.classes.get(priority, 0) + 1
        slot.last_used = now
        slot.unwanted = False

    def end_request(self, name: str, model: str, priority: int = 0) -> None:
        inst = self._live.instances.get(name)
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
        slot.last_used = self._live.clock()
        self._live.changes.notify()

    def limited(self, name: str, model: str, keep: float) -> int:
        """``name`` refused a request for ``model`` for its own concurrency limit (a 429, the
        caller's request still counted in flight): it takes no more than the others in flight
        there (at least one) for ``keep`` seconds. Returns how many others are in flight."""
        inst = self._live.instances.get(name)
        if inst is None:
            return 0
        slot = inst.slot(model)
        others = max(0, slot.inflight - 1)
        now = self._live.clock()
        learned = slot.limit if slot.limit is not None and slot.limit_until > now else None
        slot.limit = max(1, min(others, learned) if learned is not None else others)
        slot.limit_until = now + keep
        return others

    def wait_on(self, name: str, model: str, delta: int, *, for_slot: bool = False) -> None:
        """Count a request waiting for ``model``'s swap on ``name`` (+1) or no longer (-1);
        ``for_slot``: for a free slot of it, warm (``max_concurrency``)."""
        inst = self._live.instances.get(name)
        if inst is not None:
            slot = inst.slot(model)
            slot.waiting += delta
            slot.for_slot += delta if for_slot else 0

    def waiting_on(self, name: str, model: str) -> int:
        """Requests waiting for ``model``'s swap on ``name`` (0 once a reload removed it)."""
        inst = self._live.instances.get(name)
        return inst.slot(model).waiting if inst is not None else 0

    def queued_behind(self, name: str, model: str) -> bool:
        """Whether another model ``name`` serves has requests queued that wait for no swap:
        requests a swap of ``model`` there keeps waiting."""
        inst = self._live.instances.get(name)
        if inst is None:
            return False
        for other, depth in self._live.queues.depths().items():
            if other == model or other not in inst.serves:
                continue
            joined = sum(
                i.slots[other].waiting for i in self._live.instances.values() if other in i.slots
            )
            if depth > joined:
                return True
        return False
