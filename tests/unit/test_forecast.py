"""The demand by time of day that ``auto`` preloads learn (swapgate/forecast.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from swapgate.forecast import SLOT, SLOTS, DayDemand, fold
from swapgate.scheduler import PreloadScheduler
from swapgate.state import WarmState
from tests.unit.fakes import world

DAY = 86400.0
NINE = 9 * 3600.0  # slot 36


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def learned(days: int, clock: Clock, path: Path | None = None) -> DayDemand:
    """``days`` days of chat peaking at 09:00–09:30 (10 requests a slot) and a request an hour
    the rest of the day; batch once at 03:00."""
    demand = DayDemand(path, clock)
    for day in range(days):
        for hour in range(24):
            clock.at = day * DAY + hour * 3600.0 + 60
            demand.arrived("chat")
        for minute in range(0, 30, 3):
            clock.at = day * DAY + NINE + minute * 60
            demand.arrived("chat")
        clock.at = day * DAY + 3 * 3600.0
        demand.arrived("batch")
    clock.at = days * DAY + 8 * 3600.0  # the next morning, 08:00
    return demand


def test_a_daily_peak_is_learned_and_predicted_for_the_next_day() -> None:
    clock = Clock(0.0)
    demand = learned(3, clock)
    assert demand.days("chat") == 3
    assert demand.peaks("chat") == [36, 37]
    assert demand.peak_starts("chat") == [36]
    assert demand.next_peak("chat", clock.at) == 3 * DAY + NINE
    assert demand.usual("chat", 3 * DAY + NINE) == pytest.approx(6.0)  # 5 + the hourly one
    assert demand.peaks("batch") == []  # one request a day is no peak
    assert demand.next_peak("batch", clock.at) is None


def test_nothing_is_predicted_before_a_whole_day_was_seen() -> None:
    clock = Clock(0.0)
    demand = DayDemand(None, clock)
    for minute in range(0, 30, 3):
        clock.at = NINE + minute * 60
        demand.arrived("chat")
    assert demand.peaks("chat") == []
    assert demand.days("chat") == 0


def test_the_slot_under_way_counts_when_a_peak_begins_there() -> None:
    clock = Clock(0.0)
    demand = learned(2, clock)
    assert demand.next_peak("chat", 2 * DAY + NINE + 120) == 2 * DAY + NINE
    assert demand.next_peak("chat", 2 * DAY + NINE + SLOT + 1) == 3 * DAY + NINE  # under way


def test_a_peak_that_moves_is_followed_within_days() -> None:
    clock = Clock(0.0)
    demand = learned(3, clock)
    for day in range(3, 7):  # the team now starts at 11:00
        for minute in range(0, 30, 3):
            clock.at = day * DAY + 11 * 3600.0 + minute * 60
            demand.arrived("chat")
    clock.at = 7 * DAY
    assert demand.peak_starts("chat") == [44]  # four days on, 09:00 is no peak any more


def test_what_was_learned_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "demand.json"
    clock = Clock(0.0)
    demand = learned(3, clock, path)
    demand.arrived("chat")  # today's, not yet folded in
    demand.save()
    again = DayDemand(path, clock)
    assert again.peaks("chat") == [36, 37]
    assert again.days("chat") == 3
    clock.at += DAY  # today's arrival is folded in at the next day, as if never restarted
    assert again.days("chat") == 4


@pytest.mark.parametrize("text", ["{", '{"day": 1}', json.dumps({"day": 1, "models": {"a": 3}})])
def test_an_unreadable_history_is_learned_afresh(tmp_path: Path, text: str) -> None:
    path = tmp_path / "demand.json"
    path.write_text(text)
    demand = DayDemand(path, Clock(DAY))
    assert demand.peaks("a") == []
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
        models[model] = {"usual": day, "today": [0] * SLOTS, "days": 2}
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
    w = world({"instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
               "routing": {"min_residency": 0},
               "preloads": [{"model": "a", "auto": True}]})  # fmt: skip
    w.warm("x", "b")
    demand = _history(tmp_path / "demand.json", {"a": 10.0, "b": b_usually})
    scheduler = PreloadScheduler(lambda: w.preloader, w.metrics, None, demand)
    scheduler.replace(w.settings.preloads)
    await scheduler._auto("auto-a")
    assert (w.state("x", "a") is WarmState.WARM) is evicted
    job = scheduler.describe()[0]
    assert job["auto"]
    assert job["prediction"]["learned_days"] == 2
    if not evicted:
        assert job["prediction"]["skipped"] == "no cheap room: b usually as busy then"


def test_among_replicas_arrivals_wait_to_be_shared_and_the_fold_is_the_same_rule() -> None:
    clock = Clock(0.0)
    alone = learned(3, clock)
    demand = DayDemand(None, Clock(3 * DAY + NINE))
    demand.shared = True
    demand.arrived("chat")
    demand.arrived("chat")
    assert demand.take_arrivals() == {"3:chat:36": 2}
    assert demand.take_arrivals() == {}
    demand.give_back({"3:chat:36": 2})  # Redis did not take them: next time
    assert demand.take_arrivals() == {"3:chat:36": 2}
    # The fold of everyone's counts in Redis is the fold one replica makes of its own.
    shared: dict[str, object] = {"day": 0, "models": {}}
    for day in range(3):
        day_counts = [0] * SLOTS
        for hour in range(24):
            day_counts[hour * 4] += 1
        day_counts[36] += 5
        day_counts[37] += 5
        shared = fold({**shared, "day": day}, {"chat": day_counts})
    assert shared["day"] == 3
    demand.adopt(shared)
    assert demand.peaks("chat") == alone.peaks("chat") == [36, 37]
    assert demand.usual("chat", NINE) == pytest.approx(alone.usual("chat", NINE))
    assert demand.days("chat") == 3
