"""How long a model whose load failed stays out of placement on that instance, and when the
instance as a whole does (docs/architecture.md, "Backoff, and failure isolation").

A failed load of model M on instance I backs off (I, M) alone: 5 s after one failure, doubling
with each failure in a row, at most 5 minutes; a load that works resets it. I keeps serving and
loading its other models. I itself backs off only when two or more of its models failed within
``window`` (``routing.backoff_window``): then the fault is likelier the instance's than one
model's. (An instance that does not answer its polls is down, which the poller says.)

Whose fault a failed load is, when a model is failing, and how long a flapping instance stays
out (docs/operations.md, "When part of the fleet breaks").

A failed load is blamed on its **instance** when the instance could not be reached, the load ran
out of time, or it ran out of memory beside other resident models: another instance may load it.
Anything else is the **model**'s (its engine's own words: a file that does not open, a context
too large for any card).

A model is **failing** once two loads of it in a row, with no load that worked between them,
failed by its own fault within ``window`` (``routing.backoff_window``), on two instances or
with the same engine error. It is then tried by one probe load at a time, fleet-wide, the first
``PROBE_FIRST`` s after it turned failing, each next one twice as late, at most ``PROBE_MOST``;
one load that works clears it. A request for it makes at most ``ATTEMPTS`` load attempts.

An instance that went down ``FLAPS`` times within ``FLAP_WINDOW`` and is back is held out of
placement for ``HOLD_FIRST`` s, twice as long for each more, at most ``HOLD_MOST``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

FIRST = 5.0
MOST = 300.0
WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one failure costs: seconds ``model`` stays out on its instance, and seconds the
    whole instance does (0: it keeps serving and loading its other models)."""

    model: float
    instance: float = 0.0


class Backoff:
    def __init__(
        self,
        clock: Callable[[], float],
        window: float = WINDOW,
        first: float = FIRST,
        most: float = MOST,
    ) -> None:
        self._clock = clock
        self.window = window
        self._first = first
        self._most = most
        self._steps: dict[tuple[str, str | None], float] = {}  # (instance, model or None)
        self._failed_at: dict[str, dict[str, float]] = {}  # instance -> model -> last failure

    def failed(self, instance: str, model: str) -> Verdict:
        """A load of ``model`` on ``instance`` failed now."""
        now = self._clock()
        recent = self._failed_at.setdefault(instance, {})
        recent[model] = now
        for other, at in list(recent.items()):
            if now - at > self.window:
                del recent[other]
        whole = self._step((instance, None)) if len(recent) >= 2 else 0.0
        return Verdict(self._step((instance, model)), whole)

    def succeeded(self, instance: str, model: str) -> None:
        """A load of ``model`` on ``instance`` worked: both its own and the instance's count
        start again."""
        self._steps.pop((instance, model), None)
        self._steps.pop((instance, None), None)
        self._failed_at.get(instance, {}).pop(model, None)

    def _step(self, key: tuple[str, str | None]) -> float:
        step = min(max(self._steps.get(key, 0.0) * 2, self._first), self._most)
        self._steps[key] = step
        return step


Blame = Literal["model", "instance"]
ATTEMPTS = 2  # loads one request waits through before its failures are its answer
PROBE_FIRST = 10.0
PROBE_MOST = 300.0
FLAPS = 2
FLAP_WINDOW = 600.0
HOLD_FIRST = 10.0
HOLD_MOST = 300.0
_OUT_OF_MEMORY = re.compile(r"out of memory|\bOOM\b|cudaMalloc failed|failed to allocate", re.I)


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """One failed load: where, when (monotonic), the engine's words, and whose fault it is."""

    instance: str
    at: float
    error: str
    blame: Blame


def blame(error: str, *, unreachable: bool, timed_out: bool, others_resident: bool) -> Blame:
    """Whose fault a failed load is (above)."""
    if unreachable or timed_out:
        return "instance"
    if others_resident and _OUT_OF_MEMORY.search(error):
        return "instance"
    return "model"


def failing(failures: Sequence[LoadFailure], window: float) -> bool:
    """Whether ``failures`` (a model's since its last load that worked, oldest first) make it
    failing: its last two of its own fault within ``window`` of each other, on two instances or
    with the same error."""
    own = [f for f in failures if f.blame == "model"]
    if len(own) < 2:
        return False
    before, last = own[-2], own[-1]
    if last.at - before.at > window:
        return False
    return before.instance != last.instance or before.error == last.error


def probe_delay(failed_probes: int) -> float:
    """Seconds from a model's turning failing (0) or its ``failed_probes``-th failed probe to
    its next probe."""
    return min(PROBE_FIRST * 2.0**failed_probes, PROBE_MOST)


def flap_hold(downs: Sequence[float], now: float) -> float:
    """Seconds an instance back up is held out of placement, given when it went down lately
    (monotonic): none unless it went down ``FLAPS`` times within ``FLAP_WINDOW``."""
    recent = sum(1 for at in downs if now - at <= FLAP_WINDOW)
    if recent < FLAPS:
        return 0.0
    return min(HOLD_FIRST * 2.0 ** (recent - FLAPS), HOLD_MOST)
