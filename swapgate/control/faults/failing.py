"""Models that do not load, fleet-wide: every failed load of a model since its last load that
worked, from this replica's swaps and the others' (docs/operations.md, "When part of the fleet
breaks"). The rules are swapgate/policy/backoff.py's; this keeps what they read.

A failing model's requests are answered at once (``ModelFailing``) until its next probe is
due; the first request then takes the probe (``take_probe``), which pushes the next one out, so
that one load at a time tries it (across replicas, the swap claim's lock on the model holds the
same). A request counts the failures of its model since it arrived (``since``): it waits through
``ATTEMPTS`` of them at most.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from swapgate.errors import shown_to_clients
from swapgate.policy import backoff
from swapgate.policy.backoff import Blame, LoadFailure

log = logging.getLogger("swapgate.faults")
KEPT = 8  # failures kept per model: enough for the rule and for an answer naming its attempts


@dataclass(slots=True)
class Failing:
    """A model known failing: since when, its probes that failed, when the next is due, the
    engine's last words."""

    since: float
    error: str
    next_probe: float
    failed_probes: int = 0


@dataclass(slots=True)
class _Record:
    failures: list[LoadFailure] = field(default_factory=list)
    failing: Failing | None = None


class FailingModels:
    def __init__(self, clock: Callable[[], float], window: float = 60.0) -> None:
        self._clock = clock
        self.window = window  # routing.backoff_window
        self._models: dict[str, _Record] = {}
        self._seen: set[str] = set()  # models ever failing: their gauge reads 0 once mended

    def failed(self, model: str, instance: str, error: str, blame: Blame) -> Failing | None:
        """A load of ``model`` on ``instance`` failed now; returns the model's failing record,
        if it is (or now turned) failing."""
        now = self._clock()
        record = self._models.setdefault(model, _Record())
        record.failures = [
            *record.failures[-(KEPT - 1) :],
            LoadFailure(instance, now, error, blame),
        ]
        shown = shown_to_clients(error, lines=3)
        if record.failing is not None:
            if blame == "model":  # its probe failed: the next waits twice as long
                failing = record.failing
                failing.failed_probes += 1
                failing.error = shown
                failing.next_probe = now + backoff.probe_delay(failing.failed_probes)
                log.warning("model %s is failing still: its probe on %s failed", model, instance)
            return record.failing
        if not backoff.failing(record.failures, self.window):
            return None
        record.failing = Failing(now, shown, now + backoff.probe_delay(0))
        self._seen.add(model)
        log.warning(
            "model %s is failing: its loads failed on %s (%s); next try in %.0fs",
            model,
            ", ".join(sorted({f.instance for f in record.failures if f.blame == "model"})),
            shown,
            backoff.probe_delay(0),
        )
        return record.failing

    def succeeded(self, model: str) -> None:
        """A load of ``model`` worked: whatever failed before is forgotten."""
        record = self._models.pop(model, None)
        if record is not None and record.failing is not None:
            log.warning("model %s loads again: no longer failing", model)

    def of(self, model: str) -> Failing | None:
        record = self._models.get(model)
        return record.failing if record is not None else None

    def take_probe(self, model: str) -> bool:
        """Whether the caller may try ``model`` once more now (its probe is due); if so, the
        next probe is pushed out until this one has ended."""
        failing = self.of(model)
        if failing is None:
            return True
        now = self._clock()
        if now < failing.next_probe:
            return False
        failing.next_probe = now + backoff.probe_delay(failing.failed_probes + 1)
        log.info("model %s is failing: one probe load tries it now", model)
        return True

    def retry_after(self, model: str) -> int:
        """Seconds until ``model``'s next probe (at least 1)."""
        failing = self.of(model)
        left = failing.next_probe - self._clock() if failing is not None else 0.0
        return max(1, round(left))

    def since(self, model: str, started: float) -> list[LoadFailure]:
        """The failed loads of ``model`` since ``started`` (a request's arrival), oldest first."""
        record = self._models.get(model)
        return [f for f in record.failures if f.at >= started] if record is not None else []

    def last(self, model: str, instance: str) -> LoadFailure | None:
        """The latest failed load of ``model`` on ``instance`` still kept."""
        record = self._models.get(model)
        failures = record.failures if record is not None else []
        return next((f for f in reversed(failures) if f.instance == instance), None)

    def all(self) -> dict[str, Failing]:
        return {m: r.failing for m, r in self._models.items() if r.failing is not None}

    def gauge(self) -> dict[str, float]:
        """``swapgate_model_failing``: 1 for each model failing now, 0 for those once failing."""
        return {model: float(self.of(model) is not None) for model in sorted(self._seen)}

    def describe(self, model: str) -> dict[str, object] | None:
        """A failing model as operators read it (``/admin/state``, ``swapgate status``)."""
        failing = self.of(model)
        if failing is None:
            return None
        now = self._clock()
        return {
            "since_seconds": round(now - failing.since, 1),
            "error": failing.error,
            "next_probe_in": round(max(0.0, failing.next_probe - now), 1),
            "failed_probes": failing.failed_probes,
        }
