"""``stop`` and ``TaskSet``: what stops is stopped, and a shutdown is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from swapgate.tasks import TaskSet, stop


async def test_stop_cancels_and_waits_and_keeps_the_tasks_errors_to_them() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("its own")

    sleeping, failing = asyncio.create_task(forever()), asyncio.create_task(fails())
    await asyncio.sleep(0.01)
    await stop(sleeping, failing, None)  # neither the cancellation nor the error comes out
    assert sleeping.cancelled()
    assert isinstance(failing.exception(), RuntimeError)


async def test_a_cancellation_of_the_caller_goes_on_while_it_stops_a_slow_task() -> None:
    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(asyncio.sleep(0.2))  # cleans up for a while

    async def caller() -> None:
        slow = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0.01)  # it runs
        await stop(slow)

    calling = asyncio.create_task(caller())
    await asyncio.sleep(0.05)
    calling.cancel()  # the shutdown arrives while the caller waits
    with pytest.raises(asyncio.CancelledError):
        await calling


async def test_a_task_set_keeps_its_tasks_until_they_end_or_are_stopped() -> None:
    tasks, done = TaskSet(), asyncio.Event()
    tasks.spawn(done.wait())
    tasks.spawn(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    assert len(tasks) == 1, "the finished one is dropped"
    await tasks.aclose()
    assert len(tasks) == 0
