"""The activity log's row: what the gateway knows about one request once it is over (its
configuration, and the captures', are config/settings.py's ``ActivityConfig`` and
``CaptureConfig``)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

# How the request found its model: warm, after a swap (started or joined), queued behind a
# busy instance, waiting for a free slot (full), on a relay, or refused before any (a 4xx/503).
Placement = Literal["warm", "swap", "queued", "full", "relayed", "refused"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?\s*$")
_UNIT_BYTES = {
    None: 1,
    "B": 1,
    "KB": 1000,
    "KiB": 1024,
    "MB": 1000**2,
    "MiB": 1024**2,
    "GB": 1000**3,
    "GiB": 1024**3,
}
MiB = 1024**2
WEEK = 7 * 24 * 3600.0  # seconds: Duration has no unit for days


# An ``Activity``'s fields in their order: what the request path hands the log
Row = tuple[
    str, float, str | None, str, str, str | None, Placement, float | None, float | None, float,
    int | None, int | None, int, int | None, str, bool, str | None, str | None, str | None,
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Activity:
    """One request, as it ended: who asked, what for, where it ran, and how long it took."""

    request_id: str
    at: float  # wall-clock epoch seconds when the request arrived
    key: str | None  # the client key's name; None when the gateway has no keys
    model: str
    endpoint: str  # e.g. /v1/chat/completions
    instance: str | None  # where it was served; the relay's name when relayed
    placement: Placement
    wait_ms: float | None  # until the engine had it
    ttft_ms: float | None
    duration_ms: float
    tokens_in: int | None
    tokens_out: int | None
    status: int
    swap_id: int | None  # the swap it waited for, in the gateway's swap log
    error: str  # an error's kind; "" when none
    stream: bool
    trace_id: str | None = None  # its trace, while tracing is on (docs/operations.md, "Tracing")
    # Another model answered it (docs/configuration.md, "Fallback models"): the model it asked
    # for, and why that one could not (swap_failed, backoff, unavailable, context, wait_budget)
    fallback_from: str | None = None
    fallback_reason: str | None = None

    def describe(self) -> dict[str, object]:
        """The row as JSON-ready fields."""
        return dataclasses.asdict(self)
