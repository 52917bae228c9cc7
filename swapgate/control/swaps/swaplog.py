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

from swapgate.config.settings import EvictionMode
from swapgate.data.snapshot import InstanceView

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
        return record

    def end(self, record: SwapRecord, result: str, seconds: float, error: str = "") -> None:
        record.result, record.seconds, record.error = result, seconds, error
        self.version += 1

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
