"""The demand by time of day that ``auto`` preloads learn (swapgate/control/loops/forecast.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from swapgate.control.loops.forecast import SLOT, SLOTS, WEEKDAYS, WEEKENDS, DayDemand, fold
from swapgate.control.loops.scheduler import PreloadScheduler
from swapgate.data.warm import WarmState
from tests.unit.fakes import world

DAY = 86400.0
MONDAY = 4  # 1970-01-05, in days since the epoch
NINE = 9 * 3600.0  # slot 36


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def chat_day(demand: DayDemand, clock: Clock, day: int, at: float = NINE) -> None:
    """A day of chat peaking at ``at`` for 30 minutes (5 requests a slot) and a request an
    hour the rest of the day; batch once at 03:00."""
    for hour in range(24):
        clock.at = day * DAY + hour * 3600.0 + 60
        demand.arrived("chat")
    for minute in range(0, 30, 3):
        clock.at = day * DAY + at + minute * 60
        demand.arrived("chat")
    clock.at = day * DAY + 3 * 3600.0
    demand.arrived("batch")


def learned(days: int, clock: Clock, path: Path | None = None) -> DayDemand:
    """``days`` weekdays of ``chat_day`` from a Monday; the clock left at 08:00 the day after."""
    clock.at = MONDAY * DAY
    demand = DayDemand(path, clock)
    for day in range(MONDAY, MONDAY + days):
        chat_day(demand, clock, day)
    clock.at = (MONDAY + days) * DAY + 8 * 3600.0
    return demand


def test_a_daily_peak_is_learned_and_predicted_for_the_next_day() -> None:
    clock = Clock(0.0)
    demand = learned(3, clock)
    thursday = (MONDAY + 3) * DAY
    assert demand.days("chat", WEEKDAYS) == 3
    assert demand.peaks("chat", WEEKDAYS) == [36, 37]
    assert demand.peak_starts("chat", WEEKDAYS) == [36]
    assert demand.next_peak("chat", clock.at) == thursday + NINE
    assert demand.usual("chat", thursday + NINE) == pytest.approx(6.0)  # 5 + the hourly one
    assert demand.peaks("batch", WEEKDAYS) == []  # one request a day is no peak
    assert demand.next_peak("batch", clock.at) is None


def test_weekends_are_learned_apart_from_weekdays() -> None:
    clock = Clock(0.0)
    demand = learned(5, clock)  # Monday to Friday; the clock: Saturday 08:00
    saturday = (MONDAY + 5) * DAY
    assert demand.peaks("chat", WEEKENDS) == []  # no weekend seen yet
    assert demand.next_peak("chat", clock.at) == saturday + 2 * DAY + NINE  # Monday's, not now
    for day in (MONDAY + 5, MONDAY + 6):  # the weekend: a late start
        chat_day(demand, clock, day, at=11 * 3600.0)
    monday = saturday + 2 * DAY
    clock.at = monday + 8 * 3600.0
    assert demand.peak_starts("chat", WEEKENDS) == [44]
    assert demand.peak_starts("chat", WEEKDAYS) == [36]  # the weekend left weekdays as they were
    assert demand.days("chat", WEEKDAYS) == 5
    assert demand.days("chat", WEEKENDS) == 2
    assert demand.next_peak("chat", clock.at) == monday + NINE
    assert demand.usual("chat", saturday + 7 * DAY + 11 * 3600.0) == pytest.approx(6.0)


def test_nothing_is_predicted_before_a_whole_day_was_seen() -> None:
    clock = Clock(MONDAY * DAY)
    demand = DayDemand(None, clock)
    for minute in range(0, 30, 3):
        clock.at = MONDAY * DAY + NINE + minute * 60
        demand.arrived("chat")
    assert demand.peaks("chat", WEEKDAYS) == []
    assert demand.days("chat", WEEKDAYS) == 0


def test_the_slot_under_way_counts_when_a_peak_begins_there() -> None:
    clock = Clock(0.0)
    demand = learned(2, clock)  # Monday, Tuesday; the clock: Wednesday 08:00
    wednesday = (MONDAY + 2) * DAY
    assert demand.next_peak("chat", wednesday + NINE + 120) == wednesday + NINE
    assert demand.next_peak("chat", wednesday + NINE + SLOT + 1) == wednesday + DAY + NINE


def test_a_peak_that_moves_is_followed_within_days() -> None:
    clock = Clock(0.0)
    demand = learned(3, clock)
    for day in (MONDAY + 3, MONDAY + 4, MONDAY + 7, MONDAY + 8):  # four weekdays at 11:00
        for minute in range(0, 30, 3):
            clock.at = day * DAY + 11 * 3600.0 + minute * 60
            demand.arrived("chat")
    clock.at = (MONDAY + 9) * DAY
    assert demand.peak_starts("chat", WEEKDAYS) == [44]  # four weekdays on, 09:00 is no peak


def test_what_was_learned_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "demand.json"
    clock = Clock(0.0)
    demand = learned(3, clock, path)
    demand.arrived("chat")  # Thursday's, not yet folded in
    demand.save()
    again = DayDemand(path, clock)
    assert again.peaks("chat", WEEKDAYS) == [36, 37]
    assert again.days("chat", WEEKDAYS) == 3
    clock.at += DAY  # Thursday is folded in on Friday, as if never restarted
    assert again.days("chat", WEEKDAYS) == 4


def test_a_history_written_before_weekends_were_apart_is_read_as_weekdays(tmp_path: Path) -> None:
    path = tmp_path / "demand.json"
    usual = [0.0] * SLOTS
    usual[36] = 9.0
    path.write_text(
        json.dumps(
            {"day": MONDAY, "models": {"chat": {"usual": usual, "today": [0] * SLOTS, "days": 4}}}
        )
    )
    demand = DayDemand(path, Clock(MONDAY * DAY))
    assert demand.peaks("chat", WEEKDAYS) == [36]
    assert demand.days("chat", WEEKENDS) == 0


@pytest.mark.parametrize("text", ["{", '{"day": 1}', json.dumps({"day": 1, "models": {"a": 3}})])
def test_an_unreadable_history_is_learned_afresh(tmp_path: Path, text: str) -> None:
    path = tmp_path / "demand.json"
    path.write_text(text)
    demand = DayDemand(path, Clock(DAY))
    assert demand.peaks("a", WEEKDAYS) == []
    demand.arrived("a")
    demand.save()
    assert len(json.loads(path.read_text())["models"]["a"]["today"]) == SLOTS


def _history(path: Path, busy: dict[str, float]) -> DayDemand:
    """A learned day whose peaks for each model of ``busy`` begin in the slot under way."""
    slot = int(time.time() % 86400 // SLOT)
    models = {}
    for model, usual in busy.items():
        day = [0.1] * SLOTS
        day[slot] = usual
        models[model] = {
            "usual": day,
            "days": 2,
            "weekend": day,
            "weekend_days": 2,
            "today": [0] * SLOTS,
        }
    path.write_text(json.dumps({"day": int(time.time() // 86400), "models": models}))
    return DayDemand(path)


@pytest.mark.parametrize(
    ("b_usually", "evicted"),
    [(3.0, True), (20.0, False)],  # b is less busy than a then: cheap room; else none
)
async def test_an_auto_job_takes_only_free_or_cheap_room(
    tmp_path: Path, b_usually: float, evicted: bool
) -> None:
    if SLOT - time.time() % SLOT < 2:
        await asyncio.sleep(3)
    w = world(
        {
            "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
            "routing": {"min_residency": 0},
            "preloads": [{"model": "a", "auto": True}],
        }
    )
    w.warm("x", "b")
    demand = _history(tmp_path / "demand.json", {"a": 10.0, "b": b_usually})
    scheduler = PreloadScheduler(lambda: w.preloader, w.metrics, None, demand)
    scheduler.replace(w.settings.preloads)
    await scheduler._auto("auto-a")
    assert (w.state("x", "a") is WarmState.WARM) is evicted
    job = scheduler.describe()[0]
    assert job["auto"]
    assert job["prediction"]["learned_days"] == {"weekdays": 2, "weekends": 2}
    if not evicted:
        assert job["prediction"]["skipped"] == "no cheap room: b usually as busy then"


def test_among_replicas_arrivals_wait_to_be_shared_and_the_fold_is_the_same_rule() -> None:
    clock = Clock(0.0)
    alone = learned(3, clock)
    thursday = MONDAY + 3
    demand = DayDemand(None, Clock(thursday * DAY + NINE))
    demand.shared = True
    demand.arrived("chat")
    demand.arrived("chat")
    assert demand.take_arrivals() == {f"{thursday}:chat:36": 2}
    assert demand.take_arrivals() == {}
    demand.give_back({f"{thursday}:chat:36": 2})  # Redis did not take them: next time
    assert demand.take_arrivals() == {f"{thursday}:chat:36": 2}
    # The fold of everyone's counts in Redis is the fold one replica makes of its own.
    shared: dict[str, object] = {"day": MONDAY, "models": {}}
    for day in range(MONDAY, thursday):
        day_counts = [0] * SLOTS
        for hour in range(24):
            day_counts[hour * 4] += 1
        day_counts[36] += 5
        day_counts[37] += 5
        shared = fold({**shared, "day": day}, {"chat": day_counts})
    assert shared["day"] == thursday
    demand.adopt(shared)
    assert demand.peaks("chat", WEEKDAYS) == alone.peaks("chat", WEEKDAYS) == [36, 37]
    assert demand.usual("chat", thursday * DAY + NINE) == pytest.approx(
        alone.usual("chat", thursday * DAY + NINE)
    )
    assert demand.days("chat", WEEKDAYS) == 3
    saturday = fold({**shared, "day": MONDAY + 5}, {"chat": [1] * SLOTS})
    assert saturday["models"]["chat"]["weekend_days"] == 1  # a Saturday folds into weekends
    assert saturday["models"]["chat"]["days"] == 3
