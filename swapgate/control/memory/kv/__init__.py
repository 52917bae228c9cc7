"""Conversations kept across swaps: the slot book, the saved files, and the keeper that saves
and restores them (docs/kv-keep.md)."""

from swapgate.control.memory.kv.book import Claim, SlotBook
from swapgate.control.memory.kv.keeper import KvKeeper, Server

__all__ = ["Claim", "KvKeeper", "Server", "SlotBook"]
