"""What one client connection may cost (issue 15): header bytes, time to send, how many at once.

Raw sockets, because these clients misbehave below what an HTTP library lets one do.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from tests.e2e.processes import Gateway, gateway, instance, simulator, wait_for
from tests.e2e.wire import post

pytestmark = pytest.mark.e2e
CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BODY = json.dumps(CHAT).encode()


def _head(gw: Gateway, extra: str = "", length: int = len(BODY)) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {gw.url[7:]}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n{extra}\r\n"
    ).encode()


@contextmanager
def _connect(gw: Gateway, timeout: float = 10) -> Iterator[socket.socket]:
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        yield sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, object]]:
    """Read one response to the end of the connection: status, headers, JSON body."""
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1])


def test_headers_past_max_header_bytes_are_431_and_never_forwarded() -> None:
    with simulator(load_time=0.1) as sim, gateway({"instances": [instance("gpu-a", sim)]}) as gw:
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
        before = sim.stats()["requests"]
        rss_before = _rss_kib(gw.process.pid)
        answers = []
        for size in (70_000, 4 * 1024 * 1024, 32 * 1024 * 1024):
            with _connect(gw) as sock:
                # The header's value goes out in pieces; the gateway may close before the end.
                try:
                    sock.sendall(_head(gw)[:-2] + b"x-big: ")
                    for _ in range(size // 65536 + 1):
                        sock.sendall(b"v" * 65536)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                answers.append(_answer(sock))
        rss_after = _rss_kib(gw.process.pid)
        ok = httpx.post(
            f"{gw.url}/v1/chat/completions", json=CHAT, headers={"x-fine": "v" * 60_000}, timeout=30
        )
        metrics = gw.metrics()
        forwarded = sim.stats()["requests"] - before
    for status, headers, body in answers:
        assert status == 431
        assert headers["content-type"] == "application/json"
        assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]
        assert "max_header_bytes" in body["error"]["message"]  # type: ignore[index]
    assert ok.status_code == 200  # 60 KB of headers are within the default 64 KiB
    assert forwarded == 1  # only that one
    assert rss_after - rss_before < 4096  # KiB: 36 MB of headers sent, none of it kept
    assert 'swapgate_requests_total{model="unknown",route="none",status="431"} 3.0' in metrics


def test_clients_too_slow_to_send_their_request_get_408_and_their_connection_back() -> None:
    with simulator(load_time=0.1) as sim:
        config = {
            "server": {"request_read_timeout": "1s"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw, ExitStack() as stack:
            silent = [stack.enter_context(_connect(gw)) for _ in range(10)]
            slow_headers = [stack.enter_context(_connect(gw)) for _ in range(10)]
            slow_body = [stack.enter_context(_connect(gw)) for _ in range(10)]
            for sock in slow_body:
                sock.sendall(_head(gw) + BODY[:5])
            started = time.monotonic()
            head = _head(gw)
            for i in range(4):  # a byte every 0.4 s from each: alive, but far too slow
                for sock in slow_headers:
                    sock.sendall(head[i : i + 1])
                time.sleep(0.4)
            answers = [_answer(sock) for sock in silent + slow_headers + slow_body]
            took = time.monotonic() - started
            metrics = gw.metrics()
            forwarded = sim.stats()["requests"]
            after = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30)
    assert [status for status, _, _ in answers] == [408] * 30
    assert {body["error"]["code"] for _, _, body in answers} == {"request_timeout"}  # type: ignore[index]
    assert took < 5
    assert after.status_code == 200
    assert forwarded == 0
    # The ten whose headers arrived were the app's requests, the twenty others never reached
    # it: one count all the same.
    assert 'swapgate_requests_total{model="unknown",route="none",status="408"} 30.0' in metrics


def test_the_read_timeout_never_touches_an_answer_that_takes_longer() -> None:
    with simulator(load_time=0.1, token_rate=8) as sim:
        config = {
            "server": {"request_read_timeout": "1s"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            # 12 tokens at 8/s: the answer streams for 1.5 s, longer than the read timeout.
            streamed = post(
                gw.url, "/v1/chat/completions", {**CHAT, "max_tokens": 12, "stream": True}
            )
            plain = httpx.post(
                f"{gw.url}/v1/chat/completions", json={**CHAT, "max_tokens": 12}, timeout=30
            )
    assert streamed.status == 200
    assert streamed.data_lines()[-1] == "data: [DONE]"
    assert streamed.chunk_times[-1] > 1.2
    assert plain.status_code == 200
    assert plain.json()["usage"]["completion_tokens"] == 12


def test_past_max_connections_a_new_connection_is_answered_503_and_closed() -> None:
    with simulator(load_time=0.1) as sim:
        config = {
            "server": {"max_connections": 4, "request_read_timeout": "30s"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            with ExitStack() as stack:
                held = [stack.enter_context(_connect(gw)) for _ in range(4)]
                time.sleep(0.2)  # accepted
                with _connect(gw) as extra:
                    extra.sendall(_head(gw) + BODY)
                    status, headers, body = _answer(extra)
                assert held  # still open while the fifth was refused
            # Once they closed, connections are accepted again.
            wait_for(
                lambda: (
                    httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=30).status_code
                    == 200
                )
            )
    assert status == 503
    assert headers["retry-after"] == "1"
    assert headers["connection"] == "close"
    assert body["error"]["code"] == "no_capacity"  # type: ignore[index]
    assert "max_connections" in body["error"]["message"]  # type: ignore[index]


def test_bytes_that_are_not_http_get_an_openai_shaped_400() -> None:
    with (
        simulator(load_time=0.1) as sim,
        gateway({"instances": [instance("gpu-a", sim)]}) as gw,
        _connect(gw) as sock,
    ):
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nbad header line\r\n\r\n")
        status, headers, body = _answer(sock)
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert body["error"]["code"] == "invalid_request_error"  # type: ignore[index]
