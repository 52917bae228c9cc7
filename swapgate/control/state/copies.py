"""Where each model has a copy that is not cold (warm, loading or asleep): the instances, by
model, kept in step with every change of a model's state, so that a request for a warm model
looks up its copies instead of walking the fleet (docs/architecture.md, "A fleet of any size").

Every change of a model's state goes through ``ModelSlot.set_state``, which tells the index
(``Copies.mover``); a reload that replaces instances rebuilds it (``rebuild``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from swapgate.data.warm import WarmState

Mover = Callable[[WarmState, WarmState], None]


class _Slot(Protocol):
    @property
    def state(self) -> WarmState: ...


class _Instance(Protocol):
    @property
    def slots(self) -> Mapping[str, _Slot]: ...


class Copies:
    def __init__(self) -> None:
        self._on: dict[str, set[str]] = {}  # model -> the instances holding a copy
        self._order: dict[str, int] = {}  # instance -> its place in the config

    def mover(self, instance: str, model: str) -> Mover:
        """What ``model``'s slot on ``instance`` tells of each change of its state."""

        def moved(old: WarmState, new: WarmState) -> None:
            if new is not WarmState.COLD:
                self._on.setdefault(model, set()).add(instance)
            elif old is not WarmState.COLD:
                self._forget(model, instance)

        return moved

    def of(self, model: str) -> list[str]:
        """The instances holding a copy of ``model``, in the config's order."""
        held = self._on.get(model)
        if not held:
            return []
        order = self._order
        return sorted(held, key=lambda name: order.get(name, len(order)))

    def rebuild(self, instances: Mapping[str, _Instance]) -> None:
        """Start again from ``instances`` (a reload kept, replaced or removed some)."""
        self._order = {name: place for place, name in enumerate(instances)}
        self._on = {}
        for name, inst in instances.items():
            for model, slot in inst.slots.items():
                if slot.state is not WarmState.COLD:
                    self._on.setdefault(model, set()).add(name)

    def every(self) -> dict[str, list[str]]:
        """Each model with a copy somewhere, and where, in the config's order."""
        return {model: self.of(model) for model in self._on}

    def _forget(self, model: str, instance: str) -> None:
        held = self._on.get(model)
        if held is not None:
            held.discard(instance)
            if not held:
                del self._on[model]
