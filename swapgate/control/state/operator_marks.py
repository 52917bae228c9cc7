"""What operators set on an instance, by the admin API, the CLI or another replica: pins and
drains. Those set here are told to the other replicas (``Shares``)."""

from __future__ import annotations

from typing import Protocol

from swapgate.control.state.live_state import LiveState


class Shares(Protocol):
    """Told of what an operator set on this replica, for the others: a pin until ``until``
    (monotonic; 0: unpinned), a drain on or off; and an instance that refused a connection
    here (down at once, on every replica). Implemented in swapgate/cluster/swaps.py, which
    control/ does not import (the arrows point from cluster/ to control/)."""

    def pinned(self, instance: str, model: str, until: float) -> None: ...
    def drained(self, instance: str, on: bool) -> None: ...
    def down(self, instance: str) -> None: ...


class OperatorMarks:
    def __init__(self, live: LiveState, shares: Shares | None = None) -> None:
        self._live = live
        self._shares = shares

    def pin(self, name: str, model: str, until: float, *, share: bool = True) -> None:
        """Keep ``model`` out of request-driven eviction on ``name`` until ``until`` (monotonic)."""
        slot = self._live.instances[name].slot(model)
        slot.pinned_until = max(slot.pinned_until, until)
        if share and self._shares is not None:
            self._shares.pinned(name, model, slot.pinned_until)

    def unpin(self, name: str, model: str, *, share: bool = True) -> None:
        self._live.instances[name].slot(model).pinned_until = 0.0
        if share and self._shares is not None:
            self._shares.pinned(name, model, 0.0)

    def set_drained(self, name: str, drained: bool, *, share: bool = True) -> None:
        self._live.instances[name].drained = drained
        self._live.changes.notify()
        if share and self._shares is not None:
            self._shares.drained(name, drained)
