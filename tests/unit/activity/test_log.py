"""The activity log: rows recorded off the request path, queried, paged and bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from swapgate.activity.log import ActivityLog
from swapgate.activity.records import Activity
from tests.unit.activity.conftest import FakeClock, make_activity

WEEK = 7 * 24 * 3600.0


@pytest.fixture
async def log() -> AsyncIterator[ActivityLog]:
    activity = ActivityLog(None, max_rows=10_000, max_age=WEEK, clock=FakeClock(2_000.0))
    activity.start()
    yield activity
    await activity.close()


def request_ids(rows: list[tuple[int, Activity]]) -> list[str]:
    return [activity.request_id for _, activity in rows]


async def test_rows_come_back_newest_first_as_recorded(log: ActivityLog) -> None:
    first = make_activity(request_id="a", tokens_in=None, stream=False, error="timeout")
    log.record(first)
    log.record(make_activity(request_id="b"))
    log.flush()

    page = await log.query()

    assert request_ids(page.rows) == ["b", "a"]
    assert page.rows[1][1] == first  # None, False and the error survive the database
    assert page.next_before is None


async def test_a_query_sees_rows_recorded_before_it_without_a_flush(log: ActivityLog) -> None:
    log.record(make_activity(request_id="just-now"))

    assert request_ids((await log.query()).rows) == ["just-now"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"model": "qwen"}, ["qwen"]),
        ({"key": "bob"}, ["bob"]),
        ({"instance": "gpu1"}, ["gpu1"]),
        ({"status": 503}, ["503"]),
        ({"since": 1_500.0}, ["late"]),
    ],
)
async def test_each_filter_keeps_only_matching_rows(
    log: ActivityLog, query: dict[str, object], expected: list[str]
) -> None:
    log.record(make_activity(request_id="plain"))
    log.record(make_activity(request_id="qwen", model="qwen"))
    log.record(make_activity(request_id="bob", key="bob"))
    log.record(make_activity(request_id="gpu1", instance="gpu1"))
    log.record(make_activity(request_id="503", status=503))
    log.record(make_activity(request_id="late", at=1_500.0))
    log.flush()

    assert request_ids((await log.query(**query)).rows) == expected  # type: ignore[arg-type]


async def test_paging_by_before_walks_every_row_once(log: ActivityLog) -> None:
    for n in range(7):
        log.record(make_activity(request_id=f"r{n}"))
    log.flush()

    seen: list[str] = []
    before = None
    for _ in range(4):
        page = await log.query(limit=3, before=before)
        seen += request_ids(page.rows)
        before = page.next_before
        if before is None:
            break

    assert seen == [f"r{n}" for n in reversed(range(7))]


async def test_a_page_is_at_most_a_thousand_rows(log: ActivityLog) -> None:
    for n in range(1_005):
        log.record(make_activity(request_id=f"r{n}"))
    log.flush()

    page = await log.query(limit=5_000)

    assert len(page.rows) == 1_000
    assert page.next_before is not None


async def test_counts_per_bucket_key_and_model(log: ActivityLog) -> None:
    for at, key, model in [
        (1_000.0, "alice", "llama"),
        (1_010.0, "alice", "llama"),
        (1_015.0, "bob", "llama"),
        (1_070.0, "alice", "qwen"),
        (900.0, "alice", "llama"),  # before `since`: not counted
    ]:
        log.record(make_activity(at=at, key=key, model=model))
    log.flush()

    counts = await log.counts(since=960.0, bucket=60.0)

    assert counts == [
        {"at": 960.0, "key": "alice", "model": "llama", "requests": 2},
        {"at": 960.0, "key": "bob", "model": "llama", "requests": 1},
        {"at": 1_020.0, "key": "alice", "model": "qwen", "requests": 1},
    ]


async def test_only_the_newest_max_rows_are_kept() -> None:
    log = ActivityLog(None, max_rows=3, max_age=WEEK, clock=FakeClock())
    log.start()
    for n in range(5):
        log.record(make_activity(request_id=f"r{n}"))
    log.flush()

    assert request_ids((await log.query()).rows) == ["r4", "r3", "r2"]
    await log.close()


async def test_rows_older_than_max_age_are_dropped() -> None:
    clock = FakeClock(now=1_000.0)
    log = ActivityLog(None, max_rows=100, max_age=3_600.0, clock=clock)
    log.start()
    log.record(make_activity(request_id="old", at=1_000.0))
    log.record(make_activity(request_id="recent", at=4_000.0))
    log.flush()
    assert len((await log.query()).rows) == 2

    clock.now = 5_000.0  # "old" is now 4000 s old, "recent" 1000 s
    log.flush()

    assert request_ids((await log.query()).rows) == ["recent"]
    await log.close()


async def test_a_full_buffer_drops_and_counts_instead_of_blocking() -> None:
    log = ActivityLog(None, max_rows=100, max_age=WEEK, clock=FakeClock(), buffer_rows=3)
    for n in range(5):  # not started: nothing drains the buffer
        log.record(make_activity(request_id=f"r{n}"))

    assert log.dropped == 2
    log.start()
    assert request_ids((await log.query()).rows) == ["r2", "r1", "r0"]
    await log.close()


async def test_rows_recorded_after_close_are_counted_not_raised() -> None:
    log = ActivityLog(None, max_rows=100, max_age=WEEK)
    log.start()
    await log.close()
    await log.close()  # idempotent

    log.record(make_activity())

    assert log.dropped == 1


async def test_a_file_database_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state" / "activity.db"  # the directory is created
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    log.record(make_activity(request_id="kept"))
    await log.close()  # writes what was buffered

    reopened = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    reopened.start()
    page = await reopened.query()
    await reopened.close()

    assert request_ids(page.rows) == ["kept"]


async def test_usage_sums_requests_and_tokens_per_key_or_model_since_a_time(
    log: ActivityLog,
) -> None:
    rows = [
        ("alice", "a", 10, 5, 2_000.0),
        ("alice", "b", 7, None, 2_000.0),  # an engine that said only its prompt
        ("bob", "a", 1, 1, 2_000.0),
        (None, "a", 3, 4, 2_000.0),  # no key
        ("alice", "a", 1_000, 1_000, 100.0),  # before the period
    ]
    for name, model, tokens_in, tokens_out, at in rows:
        log.record(
            make_activity(key=name, model=model, tokens_in=tokens_in, tokens_out=tokens_out, at=at)
        )
    by_key = await log.usage(since=1_000.0, by="key")
    by_model = await log.usage(since=1_000.0, by="model")
    assert by_key == [
        {"key": "alice", "requests": 2, "prompt_tokens": 17, "completion_tokens": 5,
         "total_tokens": 22},
        {"key": None, "requests": 1, "prompt_tokens": 3, "completion_tokens": 4,
         "total_tokens": 7},
        {"key": "bob", "requests": 1, "prompt_tokens": 1, "completion_tokens": 1,
         "total_tokens": 2},
    ]  # fmt: skip
    assert [(r["model"], r["total_tokens"], r["requests"]) for r in by_model] == [
        ("a", 24, 3),
        ("b", 7, 1),
    ]
    with pytest.raises(ValueError, match="by must be one of key, model"):
        await log.usage(since=0.0, by="instance")
