"""The activity database at rest: private files whatever the umask, a layout with a version and
a way forward, and a disk that refuses rows without failing anything or flooding the log."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import stat
from pathlib import Path

import pytest

from swapgate.activity import database
from swapgate.activity.log import SCHEMA, ActivityLog
from tests.unit.activity.conftest import FakeClock, make_activity

WEEK = 7 * 24 * 3600.0


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_file_its_wal_and_its_folder_are_private_whatever_the_umask(
    tmp_path: Path, umask_022: None
) -> None:
    path = tmp_path / "state" / "activity.db"
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    log.record(make_activity(request_id="r1"))
    log.flush()
    files = sorted(path.parent.iterdir())
    assert [f.name for f in files] == ["activity.db", "activity.db-shm", "activity.db-wal"]
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    assert mode(path.parent) == 0o700
    await log.close()


async def test_a_file_made_world_readable_before_is_made_private(
    tmp_path: Path, umask_022: None
) -> None:
    path = tmp_path / "activity.db"
    sqlite3.connect(path).close()
    path.chmod(0o644)
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    await log.close()
    assert mode(path) == 0o600


def _version(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return int(connection.execute("PRAGMA user_version").fetchone()[0])


async def test_a_file_from_before_versions_is_stamped_and_a_new_one_is_current(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as connection:
        connection.execute("CREATE TABLE activity (id INTEGER PRIMARY KEY)")
    for path in (old, tmp_path / "new.db"):
        log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
        log.start()
        await log.close()
        assert _version(path) == database.SCHEMA_VERSION


async def test_a_version_1_file_gains_trace_ids_and_keeps_its_rows(tmp_path: Path) -> None:
    """Version 2 adds each request's trace id: a file of version 1 is migrated once, in place."""
    path = tmp_path / "activity.db"
    later = ",\n    trace_id TEXT,\n    fallback_from TEXT,\n    fallback_reason TEXT"
    version_1 = SCHEMA.replace(later, "")
    assert "trace_id" not in version_1
    row = make_activity(request_id="before")
    with sqlite3.connect(path) as connection:
        connection.executescript(version_1)
        fields = dataclasses.asdict(row)
        for later_field in ("trace_id", "fallback_from", "fallback_reason"):
            fields.pop(later_field)
        names = ", ".join(f'"{name}"' for name in fields)
        marks = ", ".join("?" * len(fields))
        connection.execute(
            f"INSERT INTO activity ({names}) VALUES ({marks})", list(fields.values())
        )
        connection.execute("PRAGMA user_version = 1")
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    log.record(make_activity(request_id="after", trace_id="ab" * 16))
    page = await log.query()
    await log.close()
    assert {a.request_id: a.trace_id for _, a in page.rows} == {"before": None, "after": "ab" * 16}
    assert _version(path) == database.SCHEMA_VERSION


async def test_a_file_from_a_newer_swapgate_is_left_alone_and_the_log_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "activity.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE activity (id INTEGER PRIMARY KEY)")
        connection.execute(f"PRAGMA user_version = {database.SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    log.record(make_activity(request_id="r1"))
    page = await log.query()
    await log.close()
    assert [a.request_id for _, a in page.rows] == ["r1"], "kept, in memory"
    assert path.read_bytes() == before
    assert "newer swapgate" in caplog.text


async def test_a_disk_that_refuses_rows_drops_them_counted_and_says_so_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = ActivityLog(None, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()

    def full(*_: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr("swapgate.activity.log._insert", full)
    caplog.set_level(logging.WARNING, "swapgate.activity.database")
    for batch in range(3):  # three drains a second apart: one warning
        for n in range(4):
            log.record(make_activity(request_id=f"r{batch}-{n}"))
        log.flush()
    await log.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "disk is full" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records), "no traceback"
    assert log.dropped == 12
    assert log.worker.failed_writes == 3
