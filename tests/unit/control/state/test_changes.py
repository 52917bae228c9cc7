"""The live state's change signal (swapgate/control/state/changes.py): a task that waits on it in a
loop stops when cancelled, even when the cancellation comes as a change wakes it; a deadline
passes even when the clock stands still at a hair before it."""

from __future__ import annotations

import asyncio
import time

from swapgate.control.state.changes import Changes
from tests.unit.fakes import ClockLoop, FakeClock


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


def test_a_deadline_a_rounding_error_away_has_passed_while_the_clock_stands_still() -> None:
    """Found by the fleet's state machine: a request's deadline (its arrival plus ``max_wait``)
    2.3e-13 s past a clock moved in steps of 0.05 and 0.3 s. asyncio runs a timer up to its
    clock's resolution early, so each wait for that remainder ended at once and ``until``
    waited again, for ever while the clock stood still (on a real clock, until it moved)."""
    clock = FakeClock(1231.2999999999995)
    loop = ClockLoop(clock)
    try:
        changes = Changes(clock)
        decided = 0

        def nothing_yet() -> None:
            nonlocal decided
            decided += 1

        waiting = loop.create_task(changes.until(nothing_yet, 1231.2999999999997))
        loop.settle()  # fails if it keeps waking itself
        assert waiting.done()
        assert waiting.result() is None, "the deadline has passed"
    finally:
        loop.close()
    assert decided == 1
