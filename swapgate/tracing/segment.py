"""A stretch of a request's wait, as its span records it: apart from the SDK's spans.py, so the
request path can note its waits without importing the SDK."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of a request's wait: queued, or waiting for a swap (whose span it links)."""

    state: str  # "queued" | "loading" | "waking"
    began: int  # epoch ns
    ended: int
    instance: str | None
    swap: SpanContext | None
