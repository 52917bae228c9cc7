"""A request's row in the activity log, as its exchange makes it: how it was placed, its
times, the tokens its answer said, and a capture's bodies cut at their limit."""

from __future__ import annotations

import pytest

from swapgate.activity.records import Activity
from swapgate.data.lease import Progress
from swapgate.errors import RateLimited
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.proxy.exchange import TAIL, Capture, Exchange

CHAT = ENDPOINTS["/v1/chat/completions"]


def _exchange(route: str = "instance/gpu", placement: str = "warm") -> Exchange:
    ex = Exchange("POST", CHAT, "req-1", started=100.0, arrived=1_700_000_000.0)
    ex.model, ex.route, ex.key = "qwen", route, "chat-ui"
    ex.progress = Progress(placement=placement, swap_id=7 if placement == "swap" else None)
    return ex


@pytest.mark.parametrize(
    ("route", "placement", "expected"),
    [
        ("instance/gpu", "warm", "warm"),
        ("instance/gpu", "swap", "swap"),
        ("instance/gpu", "queued", "queued"),
        ("instance/gpu", "full", "full"),
        ("relay/cloud", "swap", "relayed"),  # failover or fallback: the relay answered
        ("none", "warm", "refused"),  # it never reached an upstream
    ],
)
def test_its_placement(route: str, placement: str, expected: str) -> None:
    assert (
        Activity(*_exchange(route, placement).row(200, 101.0, (None, None))).placement == expected
    )


def test_its_times_are_from_its_arrival_in_milliseconds() -> None:
    ex = _exchange(placement="swap")
    ex.sent, ex.first_byte = 124.5, 124.75
    row = Activity(*ex.row(200, 125.0, (None, None)))
    assert (row.wait_ms, row.ttft_ms, row.duration_ms) == (24_500.0, 24_750.0, 25_000.0)
    assert (row.instance, row.swap_id, row.key, row.at) == ("gpu", 7, "chat-ui", 1_700_000_000.0)


def test_a_request_refused_before_any_upstream_has_no_wait_and_names_its_error() -> None:
    ex = Exchange("POST", CHAT, "req-2", started=100.0)
    ex.failed = RateLimited("chat-ui: 3 requests a minute")
    row = Activity(*ex.row(429, 100.01, (None, None)))
    assert (row.placement, row.instance, row.wait_ms, row.ttft_ms) == ("refused", None, None, None)
    assert (row.status, row.error) == (429, "rate_limited")


@pytest.mark.parametrize(
    ("answer", "tokens"),
    [
        (b'{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":40}}', (12, 40)),
        (
            b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":5,"completion_tokens":3}}'
            b"\n\ndata: [DONE]\n\n",
            (5, 3),
        ),
        (b'event: message_delta\ndata: {"usage":{"output_tokens":9}}\n\n', (None, 9)),
        (b'{"usage":{"input_tokens":7,"output_tokens":2}}', (7, 2)),  # Responses
        (b'{"choices":[{"text":"no usage said"}]}', (None, None)),
    ],
)
def test_tokens_are_what_the_answer_said_last(answer: bytes, tokens: tuple[int, int]) -> None:
    ex = _exchange()
    for at in range(0, len(answer), 7):  # as chunks arrive
        ex.keep_tail(answer[at : at + 7])
    assert ex.usage() == tokens
    row = Activity(*ex.row(200, 101.0, ex.usage()))
    assert (row.tokens_in, row.tokens_out) == tokens


def test_only_the_answers_tail_is_kept() -> None:
    ex = _exchange()
    ex.keep_tail(b'{"usage":{"prompt_tokens":1}}' + b" " * TAIL)
    ex.keep_tail(b'{"completion_tokens":4}')
    assert len(ex.tail) == TAIL
    assert ex.usage() == (None, 4)


def test_a_capture_keeps_each_body_up_to_its_limit_and_counts_the_whole() -> None:
    capture = Capture(8, [(b"content-type", b"application/json")], b"0123456789")
    for chunk in (b"abc", b"defgh", b"ijk"):
        capture.add(chunk)
    assert (bytes(capture.response_body), capture.response_size) == (b"abcdefgh", 11)
