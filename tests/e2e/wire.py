"""A raw HTTP/1.1 client over a socket: what really goes over the wire, and when; and a slow
link, a TCP relay that delays what a client sends."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class WireResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    first_byte_after: float
    chunk_times: list[float] = field(default_factory=list)
    first_event_after: float | None = None  # when the first "data:" line arrived

    def lines(self) -> list[str]:
        return self.body.decode().split("\n")

    def data_lines(self) -> list[str]:
        return [line for line in self.lines() if line.startswith("data:")]


def post(
    url: str,
    path: str,
    payload: dict[str, object],
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> WireResponse:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(payload).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sent = time.monotonic()
        sock.sendall(head.encode() + body)
        raw, times, first_event = _read_all(sock)
    header_block, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
    parsed = dict(line.split(": ", 1) for line in header_lines)
    headers = {k.lower(): v for k, v in parsed.items()}
    if headers.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return WireResponse(
        int(status_line.split()[1]),
        headers,
        rest,
        times[0] - sent,
        [t - sent for t in times],
        first_event - sent if first_event else None,
    )


def _read_all(sock: socket.socket) -> tuple[bytes, list[float], float | None]:
    chunks: list[bytes] = []
    times: list[float] = []
    first_event = None
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks), times, first_event
        chunks.append(data)
        times.append(time.monotonic())
        if first_event is None and b"data: " in b"".join(chunks):
            first_event = times[-1]


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)


@contextlib.contextmanager
def slow_link(port: int, delay: float) -> Iterator[int]:
    """A loopback port that relays to ``port``, each chunk a client sends ``delay`` seconds
    after it was sent (the answers come back at once): a far Redis, say. A latency, not a
    bandwidth: chunks sent together arrive together. Stops with its connections."""
    listener = socket.create_server(("127.0.0.1", 0))
    sockets: list[socket.socket] = [listener]

    def pump(source: socket.socket, target: socket.socket, late: float) -> None:
        if not late:
            forward(source, target)
            return
        due: queue.Queue[tuple[float, bytes]] = queue.Queue()
        threading.Thread(target=deliver, args=(due, target), daemon=True).start()
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                due.put((time.monotonic() + late, data))
        due.put((0.0, b""))

    def forward(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    def deliver(due: queue.Queue[tuple[float, bytes]], target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (item := due.get())[1]:
                time.sleep(max(0.0, item[0] - time.monotonic()))
                target.sendall(item[1])
            target.shutdown(socket.SHUT_WR)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                server = socket.create_connection(("127.0.0.1", port))
                sockets.extend((client, server))
                for args in ((client, server, delay), (server, client, 0.0)):
                    threading.Thread(target=pump, args=args, daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
