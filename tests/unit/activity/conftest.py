"""What the activity tests share: a row with sensible defaults, and a clock tests can move."""

from __future__ import annotations

import dataclasses

from swapgate.activity.records import Activity

_DEFAULT = Activity(
    request_id="r-0",
    at=1_000.0,
    key="alice",
    model="llama",
    endpoint="/v1/chat/completions",
    instance="gpu0",
    placement="warm",
    wait_ms=1.5,
    ttft_ms=20.0,
    duration_ms=250.0,
    tokens_in=10,
    tokens_out=5,
    status=200,
    swap_id=None,
    error="",
    stream=True,
)


def make_activity(**changes: object) -> Activity:
    return dataclasses.replace(_DEFAULT, **changes)  # type: ignore[arg-type]


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
