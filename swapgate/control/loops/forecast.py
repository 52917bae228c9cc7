"""Each model's usual demand by time of day, learned from its own arrivals (``auto`` preloads).

A day is 96 slots of 15 minutes (UTC); weekdays and weekends (Saturday, Sunday) each have a
usual day of their own. Arrivals count into today's slots; when a day ends, a model's usual
arrivals per slot on that kind of day become a weighted mean of the days seen (``KEEP`` of the
past, the rest the day that ended), so a pattern that moves is followed within a few days. A slot is
a model's *peak* when its usual arrivals are at least ``PEAK`` × the model's mean slot and at
least ``MIN_PEAK``. The counts live in ``demand-by-day.state`` (JSON) in the state directory,
written every few minutes and at shutdown, and read at start: a restart forgets nothing but the
last minutes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swapgate.config.paths import state_directory

log = logging.getLogger("swapgate.forecast")
SLOT = 15 * 60
SLOTS = 24 * 3600 // SLOT
KEEP = 0.7
PEAK = 2.0
MIN_PEAK = 2.0  # usual arrivals in a slot: fewer is noise, not a peak
WEEKDAYS, WEEKENDS = 0, 1  # each kind of day has a usual day of its own
FILE = "demand-by-day.state"  # not *.json: the process ledger reads those in the same place


def state_file() -> Path:
    """``$SWAPGATE_STATE_DIR/demand-by-day.state``, else under ``$XDG_STATE_HOME/swapgate``."""
    return state_directory() / FILE


@dataclass
class _Model:
    # The usual day of each kind (WEEKDAYS, WEEKENDS), and how many days of it were learned.
    usual: list[list[float]] = field(default_factory=lambda: [[0.0] * SLOTS, [0.0] * SLOTS])
    days: list[int] = field(default_factory=lambda: [0, 0])
    today: list[int] = field(default_factory=lambda: [0] * SLOTS)


class DayDemand:
    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._day = int(clock() // 86400)
        self._models: dict[str, _Model] = {}
        # Among replicas (swapgate/cluster/demand.py): the usual days are Redis's, folded
        # there from every replica's counts; here, arrivals wait to be added to those counts.
        self.shared = False
        self._untaken: dict[str, int] = {}  # "day:model:slot": arrivals
        if path is not None:
            self._read(path)

    def arrived(self, model: str) -> None:
        now = self._clock()
        self._roll(now)
        learned = self._models.get(model)  # on every request: no _Model built to be dropped
        if learned is None:
            learned = self._models[model] = _Model()
        learned.today[_slot(now)] += 1
        if self.shared:
            key = f"{int(now // 86400)}:{model}:{_slot(now)}"
            self._untaken[key] = self._untaken.get(key, 0) + 1

    def take_arrivals(self) -> dict[str, int]:
        """The arrivals counted since the last take, ``day:model:slot`` → count."""
        taken, self._untaken = self._untaken, {}
        return taken

    def give_back(self, arrivals: dict[str, int]) -> None:
        """Arrivals taken that could not be shared: taken again next time."""
        for key, count in arrivals.items():
            self._untaken[key] = self._untaken.get(key, 0) + count

    def adopt(self, learned: Mapping[str, Any]) -> None:
        """Take the usual days learned elsewhere (``fold``'s form) in place of this one's."""
        for name, model in learned.get("models", {}).items():
            usual, days = _decoded(model)
            if usual is not None:
                mine = self._models.setdefault(name, _Model())
                mine.usual, mine.days = usual, days

    def usual(self, model: str, at: float) -> float:
        """Usual arrivals of ``model`` in the slot holding ``at`` (wall time), on its kind of
        day (weekday or weekend)."""
        self._roll(self._clock())
        learned = self._models.get(model)
        return learned.usual[kind(at)][_slot(at)] if learned else 0.0

    def days(self, model: str, of: int) -> int:
        """Days of kind ``of`` (``WEEKDAYS``, ``WEEKENDS``) learned for ``model``."""
        self._roll(self._clock())
        learned = self._models.get(model)
        return learned.days[of] if learned else 0

    def peaks(self, model: str, of: int) -> list[int]:
        """The slots (0–95) that are ``model``'s peaks on days of kind ``of``, in order."""
        self._roll(self._clock())
        learned = self._models.get(model)
        if learned is None or not learned.days[of]:
            return []
        usual = learned.usual[of]
        mean = sum(usual) / SLOTS
        return [s for s, n in enumerate(usual) if n >= max(MIN_PEAK, PEAK * mean) and n > 0]

    def peak_starts(self, model: str, of: int) -> list[int]:
        """The slots where a run of ``model``'s peak slots begins on days of kind ``of``."""
        peaks = set(self.peaks(model, of))
        return [s for s in sorted(peaks) if (s - 1) % SLOTS not in peaks]

    def next_peak(self, model: str, now: float) -> float | None:
        """When the next peak of ``model`` begins (the first slot of a run of peak slots, so
        a peak lasting an hour is warmed for once), wall time, within a week: the slot under
        way if one begins there; None if it has none."""
        peaks = [set(self.peaks(model, of)) for of in (WEEKDAYS, WEEKENDS)]
        if not any(peaks):
            return None
        start = int(now // SLOT) * SLOT
        for step in range(7 * SLOTS):
            at = start + step * SLOT
            before = at - SLOT
            if _slot(at) in peaks[kind(at)] and _slot(before) not in peaks[kind(before)]:
                return float(at)
        return None

    def describe(self, model: str, now: float) -> dict[str, Any]:
        """For operators: ``model``'s arrivals today by quarter-hour (UTC), its usual day of
        today's kind, its peaks (slots) and when the next one begins (wall time)."""
        self._roll(now)
        learned = self._models.get(model)
        of = kind(now)
        return {
            "today": list(learned.today) if learned else [0] * SLOTS,
            "usual": [round(n, 2) for n in learned.usual[of]] if learned else [0.0] * SLOTS,
            "days_learned": learned.days[of] if learned else 0,
            "peaks": self.peaks(model, of),
            "next_peak": self.next_peak(model, now),
        }

    def save(self) -> None:
        if self._path is None:
            return
        data = {
            "day": self._day,
            "models": {
                m: {**_encoded(v.usual, v.days), "today": v.today} for m, v in self._models.items()
            },
        }
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(".tmp")
            temporary.write_text(json.dumps(data))
            temporary.replace(self._path)
        except OSError as exc:
            log.warning("demand history not saved to %s: %s", self._path, exc)

    def _read(self, path: Path) -> None:
        try:
            data: Any = json.loads(path.read_text())
            day, models = int(data["day"]), {}
            for name, model in data["models"].items():
                usual, days = _decoded(model)
                today = [int(n) for n in model["today"]]
                if usual is not None and len(today) == SLOTS:
                    models[name] = _Model(usual, days, today)
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("demand history in %s unreadable (%s): learning afresh", path, exc)
            return
        self._day, self._models = day, models
        self._roll(self._clock())

    def _roll(self, now: float) -> None:
        """Fold the days that ended into the usual day of their kind (a day with no arrivals
        counts as zero); among replicas the fold is Redis's (``fold``), and today's counts
        just start again."""
        day = int(now // 86400)
        while self._day < day:
            of = _day_kind(self._day)
            for learned in self._models.values():
                if not self.shared:
                    learned.usual[of], learned.days[of] = _folded(
                        learned.usual[of], learned.days[of], learned.today
                    )
                learned.today = [0] * SLOTS
            self._day += 1


def fold(learned: Mapping[str, Any], day: Mapping[str, list[int]]) -> dict[str, Any]:
    """``learned`` (``{"day": D, "models": {model: {"usual": [...], "days": n, "weekend":
    [...], "weekend_days": n}}}``) with day D's arrivals per model folded into the usual day of
    D's kind: the same rule as one replica's, for the counts of them all."""
    of = _day_kind(int(learned["day"]))
    models: dict[str, Any] = {}
    for name in set(learned.get("models", {})) | set(day):
        usual, days = _decoded(learned.get("models", {}).get(name, {}))
        if usual is None:
            usual, days = [[0.0] * SLOTS, [0.0] * SLOTS], [0, 0]
        usual[of], days[of] = _folded(usual[of], days[of], day.get(name, [0] * SLOTS))
        models[name] = _encoded(usual, days)
    return {"day": int(learned["day"]) + 1, "models": models}


def kind(at: float) -> int:
    """``WEEKENDS`` for a Saturday or Sunday (UTC), else ``WEEKDAYS``."""
    return _day_kind(int(at // 86400))


def _day_kind(day: int) -> int:
    return WEEKENDS if (day + 3) % 7 >= 5 else WEEKDAYS  # day 0, 1970-01-01, was a Thursday


def _encoded(usual: list[list[float]], days: list[int]) -> dict[str, Any]:
    return {
        "usual": [round(n, 3) for n in usual[WEEKDAYS]],
        "days": days[WEEKDAYS],
        "weekend": [round(n, 3) for n in usual[WEEKENDS]],
        "weekend_days": days[WEEKENDS],
    }


def _decoded(model: Mapping[str, Any]) -> tuple[list[list[float]] | None, list[int]]:
    """The usual days and day counts of one model as stored; None if they are not there."""
    weekdays = [float(n) for n in model.get("usual", ())]
    weekends = [float(n) for n in model.get("weekend", ())] or [0.0] * SLOTS
    if len(weekdays) != SLOTS or len(weekends) != SLOTS:
        return None, [0, 0]
    return [weekdays, weekends], [int(model.get("days", 0)), int(model.get("weekend_days", 0))]


def _folded(usual: list[float], days: int, today: list[int]) -> tuple[list[float], int]:
    if not days:
        return [float(t) for t in today], 1
    return [KEEP * u + (1 - KEEP) * t for u, t in zip(usual, today, strict=True)], days + 1


def _slot(at: float) -> int:
    return int(at % 86400 // SLOT)
