"""A client that goes away cancels its request's work (swapgate/proxy/writer.py): told by
swapgate's server, or heard by a watcher task on any other ASGI server. An answer whose end
waits for its key's tokens to be counted sends everything else as it comes."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from swapgate.errors import UpstreamError
from swapgate.proxy.writer import Disconnect, ResponseWriter, until_disconnect


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


class Wire:
    """What a writer sent, in order, with ``"counted"`` where its ``before_end`` ran."""

    def __init__(self) -> None:
        self.log: list[tuple[bytes, bool] | str] = []

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.log.append((message["body"], message["more_body"]))

    async def count(self) -> None:
        await asyncio.sleep(0)  # a Redis call, say: the end must not overtake it
        self.log.append("counted")


async def test_a_body_held_for_its_tokens_sends_its_last_chunk_once_they_are_counted() -> None:
    wire = Wire()
    writer = ResponseWriter(wire.send, [])
    await writer.start(200, [(b"content-length", b"9")])
    writer.upstream_body(event_stream=False)
    writer.hold_end(wire.count)
    for chunk in (b"abc", b"def", b"ghi"):
        await writer.write(chunk)
    assert wire.log == [(b"abc", True), (b"def", True)], "the latest chunk may be the last"
    await writer.end()
    assert wire.log[2:] == ["counted", (b"ghi", False)]
    assert writer.answered_in_full


async def test_a_stream_held_for_its_tokens_holds_only_its_last_event() -> None:
    wire = Wire()
    writer = ResponseWriter(wire.send, [])
    await writer.start(200, [], mode="pings")
    writer.hold_end(wire.count)
    await writer.write(b": swapgate loading\n\n")  # keep-alives are never held
    writer.upstream_body(event_stream=True)
    events = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]
    for event in events:
        await writer.write(event)
    assert wire.log == [(b": swapgate loading\n\n", True), *((e, True) for e in events[:2])]
    assert not writer.answered_in_full
    await writer.end()
    assert wire.log[3:] == ["counted", (b"data: [DONE]\n\n", False)]


async def test_a_stream_that_breaks_after_its_held_last_event_still_sends_it() -> None:
    wire = Wire()
    writer = ResponseWriter(wire.send, [])
    await writer.start(200, [], mode="events")
    writer.hold_end(wire.count)
    await writer.write(b"data: [DONE]\n\n")
    await writer.fail(UpstreamError("the engine went away"))
    assert wire.log[0] == (b"data: [DONE]\n\n", True), "the client has its whole answer"
    assert "counted" not in wire.log, "a failed answer's tokens are counted as it is released"
    assert writer.answered_in_full


async def test_a_last_event_split_across_two_chunks_is_held_all_the_same() -> None:
    wire = Wire()
    writer = ResponseWriter(wire.send, [])
    await writer.start(200, [], mode="events")
    writer.hold_end(wire.count)
    for chunk in (b'data: {"n": 1}\n\ndata: [DO', b"NE]\n\n"):
        await writer.write(chunk)
    assert wire.log == [(b'data: {"n": 1}\n\ndata: [DO', True)], "its end is not out"
    await writer.end()
    assert wire.log[1:] == ["counted", (b"NE]\n\n", False)]
