"""The control plane's client against a real socket that closes without answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from swapgate.drivers.http import control_client


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
