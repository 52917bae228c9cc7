"""A recording HTTP proxy in front of one real server: what reached it, and when each answer
left it, in order. The tests read the order of a vLLM server's sleeps, wakes and requests off
it (swapgate itself could not be caught lying about its own order)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass(frozen=True)
class Event:
    at: float  # time.monotonic()
    what: str  # "arrived" or "answered"
    method: str
    path: str
    status: int = 0
    body: bytes = b""  # what was answered


@dataclass
class Recorder:
    url: str  # where to send requests instead of the server
    upstream: str
    # Answers to paths starting with these keys leave this much later (a wake as slow as a
    # GPU's: the CPU build's takes milliseconds, too quick to tell who waited for it).
    slow: dict[str, float] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: Event) -> None:
        with self.lock:
            self.events.append(event)

    def seen(self) -> list[Event]:
        with self.lock:
            return list(self.events)


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    upstream = urlsplit(recorder.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def _forward(self) -> None:
            recorder.add(Event(time.monotonic(), "arrived", self.command, self.path))
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            connection = http.client.HTTPConnection(upstream.hostname or "", upstream.port)
            try:
                connection.request(self.command, self.path, body, headers)
                answer = connection.getresponse()
                status, data, answered = answer.status, answer.read(), answer.getheaders()
            except OSError as exc:  # the server is gone: a gateway's answer, as nginx's
                status, data, answered = 502, str(exc).encode(), []
            finally:
                connection.close()
            time.sleep(next((t for p, t in recorder.slow.items() if self.path.startswith(p)), 0))
            recorder.add(Event(time.monotonic(), "answered", self.command, self.path, status, data))
            self.send_response(status)
            for name, value in answered:
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@contextmanager
def recording(upstream: str, slow: dict[str, float] | None = None) -> Iterator[Recorder]:
    """A recorder in front of ``upstream``, on a free loopback port, while the block runs."""
    recorder = Recorder("", upstream, slow or {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    server.daemon_threads = True
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
