"""A client that goes away cancels its request's work (swapgate/proxy/writer.py): told by
swapgate's server, or heard by a watcher task on any other ASGI server."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from swapgate.proxy.writer import Disconnect, until_disconnect


class Work:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False
        self.finished = False

    async def run(self, seconds: float = 30.0) -> None:
        self.started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.finished = True


async def never_disconnects() -> Message:
    await asyncio.sleep(3600)
    raise AssertionError("unreachable")


async def test_a_server_that_tells_of_the_disconnect_cancels_the_work_without_a_task() -> None:
    told, work = Disconnect(), Work()
    tasks_before = len(asyncio.all_tasks())
    running = asyncio.create_task(until_disconnect(never_disconnects, work.run(), told))
    await work.started.wait()
    assert len(asyncio.all_tasks()) == tasks_before + 1, "the request's own task alone"
    told()
    with pytest.raises(ConnectionAbortedError):
        await running
    assert work.cancelled
    assert not work.finished
    assert told.callback is None


async def test_a_client_gone_before_anyone_listened_gets_no_work_done() -> None:
    told, work = Disconnect(), Work()
    told()  # while the request waited for its key's limit, say
    with pytest.raises(ConnectionAbortedError):
        await until_disconnect(never_disconnects, work.run(), told)
    assert not work.started.is_set()


async def test_work_that_ends_first_is_not_cancelled_by_a_later_disconnect() -> None:
    told, work = Disconnect(), Work()
    await until_disconnect(never_disconnects, work.run(0), told)
    told()  # the client hangs up after its answer
    assert work.finished
    assert not work.cancelled


async def test_on_any_other_server_a_watcher_hears_the_disconnect() -> None:
    work, gone = Work(), asyncio.Event()

    async def receive() -> Message:
        await gone.wait()
        return {"type": "http.disconnect"}

    running = asyncio.create_task(until_disconnect(receive, work.run()))
    await work.started.wait()
    gone.set()
    with pytest.raises(ConnectionAbortedError):
        await running
    assert work.cancelled
