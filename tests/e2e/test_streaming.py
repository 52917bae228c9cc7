"""Streams pass through unbuffered, and a client that leaves stops the upstream's work."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Gateway, Sim]]:
    with simulator(load_time=1.0, token_rate=20) as sim:
        config = {"instances": [instance("gpu-a", sim)], "routing": {"poll_interval": "500ms"}}
        with gateway(config) as gw:
            yield gw, sim


def test_the_openai_sdk_streams_through_the_gateway(pair) -> None:
    gw, _ = pair
    with gw.sdk() as client:
        stream = client.chat.completions.create(
            model="a", messages=MESSAGES, stream=True, max_tokens=6
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text.startswith("Hello from a.")


def test_chunks_arrive_as_the_upstream_sends_them(pair) -> None:
    gw, _ = pair
    body = {"model": "a", "messages": MESSAGES, "stream": True, "max_tokens": 10}
    arrivals = []
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        for line in response.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
    # 10 tokens at 20/s: a buffering proxy would deliver them all at once at the end.
    assert len(arrivals) == 11
    assert arrivals[-1] - arrivals[0] > 0.35


def test_a_client_that_disconnects_mid_stream_cancels_the_generation(pair) -> None:
    gw, sim = pair
    before = sim.stats()["cancelled"]
    body = {"model": "a", "messages": MESSAGES, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as response:
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # 200 tokens at 20/s would take 10 s; the simulator must see the cancellation at once.
    wait_for(lambda: sim.stats()["cancelled"] == before + 1, timeout=3)
    assert sim.stats()["active"] == 0
    wait_for(lambda: 'swapgate_inflight_requests{instance="gpu-a"} 0.0' in gw.metrics(), timeout=3)


def test_a_client_that_leaves_a_whole_answer_after_a_large_prompt_cancels_it(pair) -> None:
    """No task listens for the client on swapgate's own server: it tells the endpoint. A body
    past uvicorn's 64 KiB mark pauses reading; the disconnect is still seen at once."""
    gw, sim = pair
    before = sim.stats()["cancelled"]
    prompt = "word " * 60_000  # 300 kB
    body = {"model": "a", "messages": [{"role": "user", "content": prompt}], "max_tokens": 200}
    with pytest.raises(httpx.ReadTimeout):  # 200 tokens at 20/s: 10 s; it leaves after 1 s
        httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=1.0)
    wait_for(lambda: sim.stats()["cancelled"] == before + 1, timeout=3)
    wait_for(lambda: gw.metric("swapgate_requests_total", status="499") >= 1, timeout=3)


def test_a_client_that_leaves_while_waiting_does_not_stop_the_swap() -> None:
    with simulator(load_time=1.5) as sim:
        config = {"instances": [instance("gpu-a", sim)], "routing": {"poll_interval": "1h"}}
        with gateway(config) as gw:
            port = int(gw.url.rsplit(":", 1)[1])
            payload = b'{"model": "b", "messages": []}'
            request = (
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                + b"\r\ncontent-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            with socket.create_connection(("127.0.0.1", port)) as raw:
                raw.sendall(request)
                wait_for(lambda: sim.stats()["resident"] == {"b": "starting"}, timeout=3)
            wait_for(lambda: sim.stats()["resident"] == {"b": "ready"}, timeout=5)
            wait_for(lambda: 'swapgate_model_warm{instance="gpu-a",model="b"} 1.0' in gw.metrics())
            assert "swapgate_queue_depth{" not in gw.metrics(), "the waiter left the queue"
            response = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json={"model": "b", "messages": MESSAGES, "max_tokens": 1},
                timeout=10,
            )
            assert response.headers["x-swapgate-wait-ms"] == "0"
            assert sim.loads() == 1


def test_an_upstream_that_dies_mid_stream_ends_with_one_error_event(pair) -> None:
    gw, sim = pair
    sim.faults(crash_mid_stream_rate=1.0)
    try:
        received: list[str] = []
        with gw.sdk() as client, pytest.raises(openai.APIError) as failure:
            _collect(
                client.chat.completions.create(
                    model="a", messages=MESSAGES, stream=True, max_tokens=8
                ),
                received,
            )
    finally:
        sim.faults(crash_mid_stream_rate=0.0)
    assert "".join(received) == "Hello from a."  # half of 8 tokens, then the crash
    assert failure.value.code == "upstream_error"
    assert "broke off mid-answer" in failure.value.message


def _collect(stream: Iterable[ChatCompletionChunk], into: list[str]) -> None:
    for chunk in stream:
        into.append(chunk.choices[0].delta.content or "")


def test_a_stream_still_open_when_shutdown_grace_ends_gets_an_in_band_error(
    tmp_path: Path,
) -> None:
    log = tmp_path / "gateway.log"
    with simulator(load_time=0.1, token_rate=4) as sim:
        config = {"instances": [instance("gpu-a", sim)], "server": {"shutdown_grace": "1s"}}
        with gateway(config, log=log) as gw:
            body = {"model": "a", "messages": MESSAGES, "stream": True, "max_tokens": 40}
            lines = []
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
                stream = r.iter_lines()
                lines.append(next(stream))
                gw.process.send_signal(signal.SIGTERM)
                lines += [line for line in stream if line]
            gw.process.wait(timeout=10)
    assert lines[0].startswith("data: {")
    assert '"code": "shutting_down"' in lines[-1]
    assert "[DONE]" not in lines[-1]
    said = log.read_text()
    assert "/v1/chat/completions cut short: shutdown_grace ran out" in said
    assert "Traceback" not in said, said  # a line, not the ASGI server's traceback


def test_a_shutdown_grace_under_a_second_is_kept_not_turned_into_no_limit() -> None:
    with simulator(load_time=0.1, token_rate=4) as sim:
        config = {"instances": [instance("gpu-a", sim)], "server": {"shutdown_grace": "500ms"}}
        with gateway(config) as gw:
            body = {"model": "a", "messages": MESSAGES, "stream": True, "max_tokens": 40}
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
                stream = r.iter_lines()
                next(stream)
                gw.process.send_signal(signal.SIGTERM)
                stopping = time.monotonic()
                lines = [line for line in stream if line]
            gw.process.wait(timeout=15)
            stopped_after = time.monotonic() - stopping
    assert '"code": "shutting_down"' in lines[-1]
    assert stopped_after < 5  # the stream alone would have run for 10 s


def test_a_whitespace_committed_answer_cut_at_shutdown_ends_with_the_error_object_and_a_cut() -> (
    None
):
    with simulator(load_time=3) as sim:  # still loading when shutdown_grace ends
        config = {
            "instances": [instance("gpu-a", sim)],
            "server": {"shutdown_grace": "1s"},
            "keepalive": {"early_headers_after": "100ms", "interval": "200ms"},
        }
        with gateway(config) as gw:
            body = {"model": "a", "messages": MESSAGES, "max_tokens": 4}
            with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
                chunks = r.iter_bytes()
                received = [next(chunks)]  # a keep-alive: the 200 is committed, the swap runs
                gw.process.send_signal(signal.SIGTERM)
                # the body never ends: no SDK can take the 200 for a whole (empty) answer
                with pytest.raises(httpx.RemoteProtocolError):
                    received.extend(chunks)
                status = r.status_code
            gw.process.wait(timeout=10)
    assert status == 200
    assert received[0].startswith(b"\n")
    error = json.loads(b"".join(received))  # whitespace, then the error object: valid JSON
    assert error["error"]["code"] == "shutting_down"


def test_a_request_waiting_silently_at_shutdown_gets_503_shutting_down() -> None:
    with simulator(load_time=3) as sim:  # still loading when shutdown_grace ends
        config = {"instances": [instance("gpu-a", sim)], "server": {"shutdown_grace": "1s"}}
        with gateway(config) as gw:
            body = {"model": "a", "messages": MESSAGES, "max_tokens": 4}
            headers = {"x-swapgate-keepalive": "off"}  # no early 200: the status is still free
            url = f"{gw.url}/v1/chat/completions"
            answers: list[httpx.Response] = []

            def wait() -> None:
                answers.append(httpx.post(url, json=body, headers=headers, timeout=30))

            waiting = threading.Thread(target=wait)
            waiting.start()
            swapping = 'swapgate_swaps_in_progress{instance="gpu-a"} 1.0'
            wait_for(lambda: swapping in gw.metrics())
            gw.process.send_signal(signal.SIGTERM)
            waiting.join(timeout=15)
            gw.process.wait(timeout=10)
    assert answers[0].status_code == 503
    assert answers[0].headers["content-type"] == "application/json"
    assert answers[0].json()["error"]["code"] == "shutting_down"
