"""The one signal that live state changed in a way that may unblock a waiter: requests waiting
for their model and preloads wait on it, the registry's verbs raise it."""

from __future__ import annotations

import asyncio


class Changes:
    def __init__(self) -> None:
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
