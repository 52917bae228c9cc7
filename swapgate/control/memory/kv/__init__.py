"""Conversations kept across swaps: the slot books, the saved files, the keeper that saves
and restores them, and the slot each turn goes to (docs/kv-keep.md)."""

from swapgate.control.memory.kv.book import Claim, SlotBook
from swapgate.control.memory.kv.keeper import KvKeeper
from swapgate.control.memory.kv.slots import Server, Slots
from swapgate.control.memory.kv.turns import TurnSlots

__all__ = ["Claim", "KvKeeper", "Server", "SlotBook", "Slots", "TurnSlots"]
