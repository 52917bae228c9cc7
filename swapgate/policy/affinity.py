"""Prefix affinity (docs/architecture.md, "Prefix affinity"): among warm copies of a model, a
conversation goes back to the copy that served it last, whose engine still holds its prompt's
KV cache, unless that copy is busier than the least busy one by more than ``slack`` requests.

A conversation is known by its identity (swapgate/policy/conversation.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Affinity = Literal["hit", "miss", "overflow"]


def choose(
    last: str | None, open_copies: Mapping[str, int], least: str, slack: int
) -> tuple[str, Affinity]:
    """Where a conversation goes among ``open_copies`` (instance: its requests in flight)
    that can take it now; ``last``: the copy that served it last; ``least``: where it would go
    without affinity."""
    if last is None or last not in open_copies:
        return least, "miss"
    if open_copies[last] - min(open_copies.values()) > slack:
        return least, "overflow"
    return last, "hit"
