"""One loaded model's slots, as swapgate hands them out (docs/kv-keep.md, "Hands out the
slots"): which conversation each holds, which are busy, and when each was last finished with.

A claim is made and recorded in one step, with no wait between: however many turns ``claim``
at once, no two conversations get one slot. A busy slot is never taken while another is idle;
among idle ones, an empty slot goes first, then the one least recently *finished* (not started:
a long turn still running is the last to be disturbed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class _Slot:
    key: str | None = None  # the conversation whose KV it holds
    busy: bool = False  # a turn sent to it has not ended
    finished: float = 0.0  # when its last turn ended


@dataclass(frozen=True, slots=True)
class Claim:
    """A turn's slot, held until it is finished with. ``new``: the slot held another
    conversation, or none: the turn's saved KV, if any, is restored into it first. ``shared``:
    claimed in the book the replicas share (swapgate/cluster/kv_slots.py), not in ``book``."""

    book: SlotBook
    slot: int
    key: str
    new: bool
    shared: bool = False


NO_SLOT = (-1, False)  # the shared book's answer when no slot is idle, or the own one is busy


class SharedBook(Protocol):
    """The slot books of replicas on one Redis: one claim at a time across them all. Each call
    answers None when Redis does not: the replica then keeps its own book."""

    async def claim(
        self, instance: str, model: str, count: int, key: str
    ) -> tuple[int, bool] | None: ...
    async def finish(self, instance: str, model: str, slot: int, key: str) -> None: ...
    async def held(self, instance: str, model: str) -> list[tuple[int, str]] | None: ...
    async def clear(self, instance: str, model: str) -> None: ...


@dataclass(eq=False)
class SlotBook:
    count: int
    clock: Callable[[], float]
    identity: str | None = None  # of the engine that holds these slots (docs/kv-keep.md)
    where: tuple[str, str] = ("", "")  # (instance, model)
    _slots: list[_Slot] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._slots = [_Slot() for _ in range(self.count)]

    def claim(self, key: str) -> Claim | None:
        """The slot for a turn of conversation ``key``: its own if idle; else an idle one.
        None when its own is busy (a second turn at once: the engine picks) or none is idle."""
        for number, slot in enumerate(self._slots):
            if slot.key == key:
                if slot.busy:
                    return None
                slot.busy = True
                return Claim(self, number, key, new=False)
        idle = [n for n, slot in enumerate(self._slots) if not slot.busy]
        if not idle:
            return None
        number = min(idle, key=lambda n: (self._slots[n].key is not None, self._slots[n].finished))
        slot = self._slots[number]
        slot.key, slot.busy = key, True
        return Claim(self, number, key, new=True)

    def finish(self, claim: Claim) -> None:
        """The claimed turn ended: its slot is idle again and keeps its conversation."""
        slot = self._slots[claim.slot]
        slot.busy, slot.finished = False, self.clock()

    def held(self) -> list[tuple[int, str]]:
        """(slot, conversation) of every slot holding one, most recently finished first: the
        order they are saved in within a budget."""
        holding = [(s.finished, n, s.key) for n, s in enumerate(self._slots) if s.key is not None]
        return [(n, key) for _, n, key in sorted(holding, key=lambda h: h[0], reverse=True)]
