"""What the swap coordinator tells the registry of the swaps it runs: a swap begins and ends,
models leave and stay, another replica's swap warmed a model, room is reserved for a starving
request (docs/architecture.md, "Swaps")."""

from __future__ import annotations

from swapgate.control.state.live_state import LiveState
from swapgate.control.state.slots import LEAVING
from swapgate.data.warm import WarmState


class SwapMarks:
    def __init__(self, live: LiveState) -> None:
        self._live = live

    def begin_swap(self, name: str, model: str, eta: float) -> None:
        inst = self._live.instances[name]
        now = self._live.clock()
        inst.swapping, inst.swap_done_by = model, now + eta
        if inst.reserved_for is not None:  # the swap takes the room: what it spares serves again
            inst.reserved_for, inst.reserved_until = None, 0.0
            for slot in inst.slots.values():
                if slot.closing_until != LEAVING:
                    slot.closing_until = 0.0
        inst.generation += 1
        inst.slot(model).set_state(WarmState.LOADING, now)
        self._live.changes.notify()

    def evicted(self, name: str, model: str, to: WarmState = WarmState.COLD) -> None:
        """``model`` left ``name``: cold, or asleep where the backend keeps it (vLLM)."""
        inst = self._live.instances[name]
        inst.generation += 1
        inst.slot(model).set_state(to, self._live.clock())

    def close_for_eviction(self, name: str, models: tuple[str, ...]) -> None:
        """``models`` are being evicted from ``name``: no new requests for them go there (they
        queue for the next swap) until the eviction ends (``reopen_after_eviction``)."""
        if not models:
            return
        inst = self._live.instances[name]
        for model in models:
            inst.slot(model).closing_until = LEAVING
        self._live.changes.notify()

    def reopen_after_eviction(self, name: str) -> None:
        """The evictions on ``name`` ended: a model still warm (its eviction failed) serves."""
        inst = self._live.instances.get(name)
        if inst is None:
            return
        for slot in inst.slots.values():
            if slot.closing_until == LEAVING:
                slot.closing_until = 0.0
        self._live.changes.notify()

    def warmed(self, name: str, model: str) -> None:
        """``model`` is warm on ``name``: another replica's swap made it so."""
        inst = self._live.instances[name]
        now = self._live.clock()
        inst.generation += 1
        slot = inst.slot(model)
        slot.set_state(WarmState.WARM, now)
        slot.last_used = max(slot.last_used, now)
        self._live.changes.notify()

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
        inst = self._live.instances[name]
        now = self._live.clock()
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
        self._live.changes.notify()

    def reserve(self, name: str, models: tuple[str, ...], until: float, room_for: str) -> None:
        """Send no new requests to ``models`` on ``name`` until ``until``, so that they drain
        and make room for ``room_for``, whose request has waited too long (the starvation rule).
        The room is ``room_for``'s: no other model may swap onto ``name`` meanwhile."""
        inst = self._live.instances[name]
        for model in models:
            inst.slot(model).closing_until = until
        inst.reserved_for, inst.reserved_until = room_for, until
        self._live.changes.notify()

    def unreserve(self, name: str, room_for: str) -> None:
        """The request the room on ``name`` was made for no longer waits. Unless its swap has
        begun there (which takes the room), the models closed for it serve again."""
        inst = self._live.instances.get(name)
        if inst is None or inst.reserved_for != room_for:
            return
        inst.reserved_for, inst.reserved_until = None, 0.0
        for slot in inst.slots.values():
            if slot.closing_until != LEAVING:
                slot.closing_until = 0.0
        self._live.changes.notify()

    def mark_abandoned(self, name: str, model: str) -> None:
        """``model``, just loaded on ``name``, was abandoned by its every request: it goes first
        when room is needed, whatever its residency."""
        inst = self._live.instances.get(name)
        if inst is not None:
            inst.slot(model).unwanted = True
