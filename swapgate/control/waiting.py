"""Waiting on live state: one loop that decides again at every change, for requests and preloads.

Every change that can unblock a waiter (a swap begins or ends, a request ends, a poll answers)
wakes it; the recheck interval bounds how late it notices what no event marks, such as
``min_residency`` running out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from swapgate.control.registry import Registry

RECHECK_INTERVAL = 0.5
T = TypeVar("T")


async def until(registry: Registry, decide: Callable[[], T | None], deadline: float) -> T | None:
    """Call ``decide`` now and after every change until it returns something; None once
    ``deadline`` (by the registry's clock) has passed. ``decide`` may raise to end the wait."""
    while True:
        outcome = decide()
        if outcome is not None:
            return outcome
        remaining = deadline - registry.clock()
        if remaining <= 0:
            return None
        await registry.wait_for_change(min(remaining, RECHECK_INTERVAL))
