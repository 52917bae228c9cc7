"""The one signal that live state changed in a way that may unblock a waiter, and the one loop
that waits on it (``until``), for requests and preloads: the registry's parts raise it.

Every change that can unblock a waiter (a swap begins or ends, a request ends, a poll answers)
wakes it; the recheck interval bounds how late it notices what no event marks, such as
``min_residency`` running out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

RECHECK_INTERVAL = 0.5
# asyncio runs a timer up to its clock's resolution early (1 ns for CLOCK_MONOTONIC): a wait
# for what remains of a deadline can end a hair before it, and ``until`` would wait again for
# that hair, at once, as many times as the clock stands still. Closer than this, it has passed.
DEADLINE_SLACK = 1e-6
T = TypeVar("T")


class Changes:
    def __init__(self, clock: Callable[[], float]) -> None:
        """``clock``: the live state's, by which ``until``'s deadlines are read."""
        self._clock = clock
        self._event = asyncio.Event()
        self._waiters = 0

    async def wait(self, timeout: float) -> None:
        """Return at the next change, or at ``timeout``."""
        event = self._event
        self._waiters += 1
        try:
            # Not wait_for: in Python 3.11 it swallows a cancellation that arrives as the event
            # is set, and a loop around it then never ends (a gateway that never exits).
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            self._waiters -= 1

    def notify(self) -> None:
        """Wake every waiter; free when nobody waits (the warm path raises it at no cost)."""
        if self._waiters:
            self._event.set()
            self._event = asyncio.Event()

    async def until(self, decide: Callable[[], T | None], deadline: float) -> T | None:
        """Call ``decide`` now and after every change until it returns something; None once
        ``deadline`` (by the clock) has passed. ``decide`` may raise to end the wait."""
        while True:
            outcome = decide()
            if outcome is not None:
                return outcome
            remaining = deadline - self._clock()
            if remaining <= DEADLINE_SLACK:
                return None
            await self.wait(min(remaining, RECHECK_INTERVAL))
