"""The data plane's client against a real socket server that drops kept-alive connections the way
uvicorn does after its idle timeout: a request caught by that race fails at once as closed, the
retry rule sends it to the same upstream again (swapgate/policy/retry.py), and it gets its
answer there on a new connection."""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
import time

import pytest

from swapgate.errors import UpstreamClosed, UpstreamUnreachable
from swapgate.policy.retry import Failure, Next, Outcome, after
from swapgate.proxy.upstream import UpstreamClient, UpstreamResponse

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_a_request_on_a_connection_the_server_just_closed_is_sent_again() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(ANSWER)  # the first request on a connection is answered, kept alive...
        await writer.drain()
        await _read_request(reader)
        writer.close()  # ...the next one finds the server closing it, unanswered

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = UpstreamClient(idle_timeout=5.0)
    await client.start()
    closed = 0

    async def send() -> UpstreamResponse:
        nonlocal closed
        sent = time.perf_counter()
        try:
            return await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")
        except UpstreamClosed:
            closed += 1
            held = time.perf_counter() - sent
            assert after(Outcome(Failure.CLOSED, held, resendable=True))[0] is Next.SAME
            return await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")

    try:
        for _ in range(3):
            response = await send()
            assert response.status == 200
            assert b"".join([chunk async for chunk in response.chunks()]) == b"{}"
            response.release()
    finally:
        await client.aclose()
        server.close()
    assert connections == 3  # each dropped connection was replaced by a new one
    assert closed == 2  # the second and third requests met a closing connection


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    await reader.readexactly(length)


async def test_a_reset_says_the_request_was_never_read_and_a_close_after_reading_it_does_not() -> (
    None
):
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the body left unread
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()  # closing with bytes unread is a reset

    async def crash(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)  # read whole, then gone: a crash mid-request
        writer.close()

    client = UpstreamClient(idle_timeout=5.0)
    await client.start()
    unread = []
    try:
        for serve in (reset, crash):
            server = await asyncio.start_server(serve, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            try:
                await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}" * 20_000)
            except UpstreamClosed as closed:
                unread.append(closed.unread)
            finally:
                server.close()
    finally:
        await client.aclose()
    assert unread == [True, False]


async def test_a_peeked_body_is_still_given_whole_by_chunks() -> None:
    """The fallback rule reads an error's first bytes (``peek``); the client still gets every
    byte the engine sent, the peeked ones first."""
    said = b'{"error":{"message":"request (799 tokens) exceeds the available context size"}}'
    body = said + b" " * 10_000  # longer than a peek

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        head = f"HTTP/1.1 400 Bad Request\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = UpstreamClient(idle_timeout=5.0)
    await client.start()
    try:
        response = await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")
        peeked = await response.peek(64)
        assert peeked == said[:64]
        assert await response.peek(64) == peeked, "peeking again reads nothing more"
        assert await response.excerpt() == "request (799 tokens) exceeds the available context size"
        assert b"".join([chunk async for chunk in response.chunks()]) == body
        response.release()
    finally:
        await client.aclose()
        server.close()


async def test_a_refused_connection_says_the_host_is_down_a_local_failure_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused: the instance is not there (down at once). Out of descriptors: this side's
    trouble, which must not take a healthy instance down (docs/operations.md)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    listening.close()  # nothing listens there now
    client = UpstreamClient(idle_timeout=5.0)
    await client.start()
    try:
        with pytest.raises(UpstreamUnreachable) as refused:
            await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")
        assert refused.value.host_down

        def out_of_descriptors(*args: object, **kwargs: object) -> socket.socket:
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(socket, "socket", out_of_descriptors)
        with pytest.raises(UpstreamUnreachable) as local:
            await client.open("POST", f"http://127.0.0.1:{port}/v1/x", [], b"{}")
        assert not local.value.host_down
    finally:
        monkeypatch.undo()
        await client.aclose()
