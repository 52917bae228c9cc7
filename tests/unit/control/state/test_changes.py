"""The live state's change signal (swapgate/control/state/changes.py): a task that waits on it in a
loop stops when cancelled, even when the cancellation comes as a change wakes it."""

from __future__ import annotations

import asyncio
import time

from swapgate.control.state.changes import Changes


async def test_a_loop_that_waits_for_changes_stops_when_cancelled_at_a_change() -> None:
    changes = Changes(time.monotonic)
    woken = 0

    async def follow() -> None:
        nonlocal woken
        while True:
            await changes.wait(0.2)
            woken += 1

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)
    changes.notify()  # wakes it, and in the same moment it is told to stop
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done, "it stopped (Python 3.11's wait_for swallowed this cancellation)"
    assert task.cancelled()


async def test_it_returns_at_a_change_or_at_its_timeout() -> None:
    changes = Changes(time.monotonic)
    waiting = asyncio.create_task(changes.wait(5))
    await asyncio.sleep(0.01)
    changes.notify()
    await asyncio.wait_for(waiting, 1)
    started = asyncio.get_running_loop().time()
    await changes.wait(0.05)
    assert asyncio.get_running_loop().time() - started >= 0.05
