"""The swaps of the last while, for operators (the dashboard, docs/operations.md): what ran,
what it evicted and why those, how long it took and how it ended.

The coordinator writes a record when a swap begins and completes it when the swap ends; the
dashboard reads the log. ``version`` moves at every change, so a reader knows when to look.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from swapgate.config.settings import EvictionMode
from swapgate.data.snapshot import InstanceView

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from opentelemetry.trace import Span, SpanContext

    from swapgate.tracing.spans import Attribute, Tracing

KEPT = 50  # records kept, newest last


@dataclass(slots=True)
class SwapRecord:
    id: int
    instance: str
    model: str
    kind: str  # load | wake
    victims: tuple[str, ...]
    reason: str  # why those victims (``eviction_reason``); "" when none
    started_at: float  # wall clock
    eta: float
    seconds: float | None = None  # once ended
    result: str | None = None  # ok | failed | timeout | abandoned; None while it runs
    error: str = ""  # what went wrong, for a failed or timed-out swap
    span: Span | None = None  # its trace span, while tracing (swapgate/tracing/)

    def describe(self) -> dict[str, object]:
        return {
            "id": self.id,
            "instance": self.instance,
            "model": self.model,
            "kind": self.kind,
            "victims": list(self.victims),
            "reason": self.reason,
            "started_at": self.started_at,
            "eta_seconds": round(self.eta, 3),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "result": self.result,
            "error": self.error,
        }


@dataclass
class SwapLog:
    records: deque[SwapRecord] = field(default_factory=lambda: deque(maxlen=KEPT))
    version: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # Each swap a span too, from its begin to its end (docs/operations.md, "Tracing"): a child
    # of the request whose wait began it, linked from every request that waited for it
    tracing: Tracing | None = None

    def begin(
        self,
        instance: str,
        model: str,
        kind: str,
        victims: tuple[str, ...],
        reason: str,
        eta: float,
    ) -> SwapRecord:
        record = SwapRecord(
            next(self._ids), instance, model, kind, victims, reason, time.time(), eta
        )
        self.records.append(record)
        self.version += 1
        if self.tracing is not None:
            attributes: dict[str, Attribute] = {
                "swapgate.model": model,
                "swapgate.instance": instance,
                "swapgate.evicted": list(victims),
                "swapgate.kind": kind,
                "swapgate.swap_id": record.id,
            }
            record.span = self.tracing.span(f"swap {model}", attributes)
        return record

    def end(
        self,
        record: SwapRecord,
        result: str,
        seconds: float,
        error: str = "",
        tier: str = "unknown",
        size: int | None = None,
    ) -> None:
        """``tier``: where its weights were read from; ``size``: their bytes, if known."""
        record.result, record.seconds, record.error = result, seconds, error
        self.version += 1
        if record.span is not None and self.tracing is not None:
            attributes: dict[str, Attribute] = {"swapgate.result": result, "swapgate.tier": tier}
            if size and result == "ok":  # a load reads its weights, from whatever tier
                attributes["swapgate.bytes_read"] = size
            failed = error or ("" if result in ("ok", "abandoned", "handed over") else result)
            self.tracing.finish(record.span, attributes, failed)

    def enter(self, instance: str) -> None:
        """The running swap's span is the current one for the rest of this task (the swap's
        own): what it does next is its children."""
        record = self.running_on(instance)
        if record is not None and record.span is not None and self.tracing is not None:
            self.tracing.enter(record.span)

    def span_of(self, swap_id: int | None) -> SpanContext | None:
        """The trace span context of swap ``swap_id``, if it is still kept and was traced."""
        record = next((r for r in reversed(self.records) if r.id == swap_id), None)
        if record is None or record.span is None:
            return None
        return record.span.get_span_context()

    def running(self) -> list[SwapRecord]:
        return [r for r in self.records if r.result is None]

    def running_on(self, instance: str) -> SwapRecord | None:
        """The swap running on ``instance`` (one at a time: its swap slot)."""
        return next((r for r in self.running() if r.instance == instance), None)

    def last_of(self, instance: str, model: str) -> int | None:
        """The id of the latest swap of ``model`` onto ``instance``, if one is still kept."""
        for record in reversed(self.records):
            if record.instance == instance and record.model == model:
                return record.id
        return None

    def last_failure(self, instance: str) -> SwapRecord | None:
        """The latest swap on ``instance`` that failed or timed out (the reason of a backoff)."""
        for record in reversed(self.records):
            if record.instance == instance and record.result in ("failed", "timeout"):
                return record
        return None


def eviction_reason(view: InstanceView, victims: tuple[str, ...], eviction: EvictionMode) -> str:
    """Why placement chose ``victims`` on ``view`` (docs/configuration.md, ``eviction``):
    ``abandoned`` (loaded for requests that all went away: the first to go), ``memory`` (the
    count had room, the bytes did not), else the eviction rule that ranked them: ``demand``
    (least expected cost of its return) or ``residency`` (least recently used, its
    ``min_residency`` over)."""
    if not victims:
        return ""
    if any(view.models[v].unwanted for v in victims if v in view.models):
        return "abandoned"
    if view.memory is not None and view.resident < view.capacity:
        return "memory"
    return "demand" if eviction == "demand" else "residency"
