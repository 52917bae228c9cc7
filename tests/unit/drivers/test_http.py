"""The control plane's client against a real socket that closes without answering."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from swapgate.config.settings import RoutingConfig
from swapgate.drivers.http import LIMITS, control_client


@asynccontextmanager
async def server(closes: int) -> AsyncIterator[tuple[str, list[bytes]]]:
    """Closes the first ``closes`` connections once it has read a request; answers the rest."""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        if len(seen) > closes:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield f"http://127.0.0.1:{port}/slots/0?action=save", seen


async def test_a_call_the_server_closed_unanswered_goes_once_more() -> None:
    async with server(closes=1) as (url, seen), control_client() as client:
        answer = await client.post(url, json={"filename": "a"})
    assert answer.text == "ok"
    assert len(seen) == 2


async def test_it_goes_once_more_only() -> None:
    async with server(closes=5) as (url, seen), control_client() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, json={"filename": "a"})
    assert len(seen) == 2


async def test_a_plain_client_gives_up_at_the_first_close() -> None:
    # What the keeper's calls met before they shared the control client (the test is the proof
    # that the server above does close the way an idle engine does).
    async with server(closes=1) as (url, seen), httpx.AsyncClient() as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(url, json={"filename": "a"})
    assert len(seen) == 1


@asynccontextmanager
async def servers(count: int) -> AsyncIterator[tuple[list[str], list[int]]]:
    """``count`` servers answering every request on a kept-alive connection; each one's
    count of connections accepted."""
    accepted = [0] * count
    handlers: list[asyncio.Task[None]] = []

    def serve(
        index: int,
    ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted[index] += 1
            handlers.append(asyncio.ensure_future(answer(reader, writer)))

        return connection

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        writer.close()
        await writer.wait_closed()

    listeners = [await asyncio.start_server(serve(i), "127.0.0.1", 0) for i in range(count)]
    urls = [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}/running" for s in listeners]
    try:
        yield urls, accepted
    finally:
        for listener in listeners:
            listener.close()
        await asyncio.gather(*handlers)  # each ends at its connection's close


async def test_a_fleet_keeps_one_connection_to_each_server_between_rounds() -> None:
    # One pool for all kept 20 idle connections: a fleet of 30 opened 10 anew every round
    async with servers(30) as (urls, accepted), control_client() as client:
        for _ in range(3):  # three rounds of polls, all at once
            answers = await asyncio.gather(*(client.get(url) for url in urls))
            assert {answer.text for answer in answers} == {"ok"}
    assert accepted == [1] * 30


def test_idle_connections_outlive_the_default_poll_interval() -> None:
    # httpx's own expiry (5 s) equals the default poll interval: every poll connected anew
    assert LIMITS.keepalive_expiry is not None
    assert LIMITS.keepalive_expiry > RoutingConfig().poll_interval
