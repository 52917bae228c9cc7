"""The replicas' events: each kind survives the wire, and what is not an event is ignored."""

from __future__ import annotations

import json

import pytest

from swapgate.cluster.messages import (
    Beat,
    Down,
    Drained,
    Event,
    Evicted,
    Heard,
    Pinned,
    SwapDone,
    SwapStarted,
    decode,
    encode,
)

EVENTS: list[Event] = [
    SwapStarted("gpu-1", "qwen", 12.5),
    SwapDone("gpu-1", "qwen", True, 11.2, 0.0),
    SwapDone("gpu-1", "qwen", False, 0.0, 5.0),
    SwapDone("gpu-1", "qwen", False, 0.0, 5.0, "exit status 1: bad magic", "model"),
    SwapDone("gpu-1", "qwen", False, 0.0, 5.0, "connection refused", "instance"),
    Down("gpu-4"),
    Evicted("gpu-2", "llama"),
    Pinned("gpu-2", "llama", 1_800_000_000.0),
    Drained("gpu-3", True),
    Beat({"gpu-1": {"qwen": 3}}),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_each_event_comes_back_as_it_was_sent_with_its_sender(event: Event) -> None:
    assert decode(encode(event, "replica-a")) == Heard("replica-a", event)


def test_the_wire_keeps_the_one_letter_keys_earlier_releases_read() -> None:
    wire = json.loads(encode(SwapDone("gpu-1", "qwen", True, 11.2, 0.0), "r1"))
    assert wire == {
        "t": "done",
        "i": "gpu-1",
        "m": "qwen",
        "ok": True,
        "s": 11.2,
        "b": 0.0,
        "r": "r1",
    }


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "not json",
        "[1, 2]",
        '{"t": "swap"}',
        '{"t": "nope", "i": "x"}',
        '{"t": "beat"}',
        '{"t": "swap", "i": 3}',
        '{"t": "done", "i": "x", "s": "soon"}',
        None,
        42,
    ],
)
def test_what_is_not_an_event_is_ignored(raw: object) -> None:
    assert decode(raw) is None
