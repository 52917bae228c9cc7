"""The activity log: one row per request, kept in SQLite for the dashboard and the admin API.

``record`` is called on the request path and only appends to a bounded buffer; the database's
own thread (``SqliteWorker``) writes rows in batches and keeps the table within ``max_rows`` and
``max_age``. Queries run on that same thread and are awaited.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swapgate.activity.database import SqliteWorker, WriteBuffer
from swapgate.activity.records import Activity, Row

BUFFER_ROWS = 10_000  # rows waiting for the writer; beyond this they are dropped and counted
PRUNE_EVERY = 5.0  # seconds between enforcing max_rows and max_age
MAX_LIMIT = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    at REAL NOT NULL,
    "key" TEXT,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    instance TEXT,
    placement TEXT NOT NULL,
    wait_ms REAL,
    ttft_ms REAL,
    duration_ms REAL NOT NULL,
    tokens_in INTEGER,
    tokens_out INTEGER,
    status INTEGER NOT NULL,
    swap_id INTEGER,
    error TEXT NOT NULL,
    stream INTEGER NOT NULL,
    trace_id TEXT,
    fallback_from TEXT,
    fallback_reason TEXT
);
CREATE INDEX IF NOT EXISTS activity_at ON activity (at);
"""

_COLUMNS = tuple(field.name for field in dataclasses.fields(Activity))
_COLUMN_LIST = ", ".join(f'"{name}"' for name in _COLUMNS)
_ROW = f"({', '.join('?' * len(_COLUMNS))})"
# Rows per INSERT: few statements per batch, yet short ones, since the writer holds the GIL
# while it builds each (SQLite takes at most 32,766 parameters in one).
ROWS_PER_INSERT = 256
_SELECT = f"SELECT id, {_COLUMN_LIST} FROM activity"
_OLDER_THAN = "DELETE FROM activity WHERE at < ?"
_BEYOND_NEWEST = (  # the subquery is NULL, and nothing goes, while there are few enough rows
    "DELETE FROM activity WHERE id <= (SELECT id FROM activity ORDER BY id DESC LIMIT 1 OFFSET ?)"
)
_COUNTS = (
    'SELECT CAST(at / ? AS INTEGER) AS slot, "key", model, COUNT(*) FROM activity'
    ' WHERE at >= ? GROUP BY slot, "key", model ORDER BY slot, "key", model'
)

USAGE_BY = {"key": '"key"', "model": "model"}
_USAGE = (
    "SELECT {column}, COUNT(*), COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0)"
    " FROM activity WHERE at >= ? GROUP BY {column}"
    " ORDER BY COALESCE(SUM(tokens_in), 0) + COALESCE(SUM(tokens_out), 0) DESC, {column}"
)


@dataclass(frozen=True, slots=True)
class Page:
    """Rows newest first, each with its database id; ``next_before`` asks for the next page."""

    rows: list[tuple[int, Activity]]
    next_before: int | None  # None on the last page

    def describe(self) -> dict[str, object]:
        """JSON-ready: each row's fields with its ``id``."""
        rows = [{"id": row_id, **activity.describe()} for row_id, activity in self.rows]
        return {"rows": rows, "next_before": self.next_before}


class ActivityLog:
    """Per-request rows in SQLite, written off the request path, bounded by count and age."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_rows: int,
        max_age: float,
        clock: Callable[[], float] = time.time,
        buffer_rows: int = BUFFER_ROWS,
    ) -> None:
        self._worker = SqliteWorker(path)
        self._pending: WriteBuffer[Row] = WriteBuffer(buffer_rows)
        self._max_rows = max_rows
        self._max_age = max_age
        self._clock = clock
        self._pruned_at = -math.inf  # on the worker thread only
        self._worker.attach(SCHEMA, self._write_pending)

    @property
    def worker(self) -> SqliteWorker:
        """The database's thread and connection, for ``Captures`` to share."""
        return self._worker

    @property
    def dropped(self) -> int:
        """Rows lost because the buffer was full (the disk fell behind), the disk refused them
        (full, read-only), or the log was closed."""
        return self._pending.dropped

    def start(self) -> None:
        """Open the database, creating its directory (in memory when it cannot be opened)."""
        self._worker.start()

    async def close(self) -> None:
        """Write what is buffered and close the database; idempotent."""
        await self._worker.close()

    def record(self, activity: Activity) -> None:
        """Keep ``activity`` without waiting: never touches the disk, never raises."""
        self._pending.put(_values(activity))

    def record_row(self, row: Row) -> None:
        """``record`` for the request path: the row as a tuple (``Exchange.row``)."""
        self._pending.put(row)

    def flush(self) -> None:
        """Block until everything recorded so far (captures too) is written and bounds applied."""
        self._worker.call(self._prune)

    async def query(
        self,
        *,
        model: str | None = None,
        key: str | None = None,
        instance: str | None = None,
        status: int | None = None,
        since: float | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> Page:
        """Rows newest first (in the order recorded), matching every filter given.

        ``since`` is epoch seconds (``at >= since``); ``before`` a row's id, from a previous
        page's ``next_before``; ``limit`` is held to 1..1000.
        """
        clauses, params = _filters(model, key, instance, status, since, before)
        limit = min(max(limit, 1), MAX_LIMIT)
        sql = f"{_SELECT}{clauses} ORDER BY id DESC LIMIT {limit + 1}"
        found = await self._worker.run(lambda db: db.execute(sql, params).fetchall())
        rows = [(row[0], _activity(row[1:])) for row in found[:limit]]
        return Page(rows, rows[-1][0] if len(found) > limit else None)

    async def counts(self, *, since: float, bucket: float) -> list[dict[str, object]]:
        """Requests per time bucket, key and model since ``since``, for a chart, oldest first.

        Buckets are whole multiples of ``bucket`` seconds since the epoch, so they stay put as
        the chart refreshes; ``at`` is a bucket's start, the first may begin before ``since``.
        """
        if not bucket > 0:
            raise ValueError(f"bucket must be a positive number of seconds, not {bucket}")
        found = await self._worker.run(lambda db: db.execute(_COUNTS, (bucket, since)).fetchall())
        return [
            {"at": slot * bucket, "key": key, "model": model, "requests": requests}
            for slot, key, model, requests in found
        ]

    async def usage(self, *, since: float, by: str) -> list[dict[str, object]]:
        """Requests and the tokens their engines reported since ``since``, per client key
        (``by="key"``, None for requests without one) or per model, most tokens first."""
        if by not in USAGE_BY:
            raise ValueError(f"by must be one of {', '.join(USAGE_BY)}, not {by!r}")
        sql = _USAGE.format(column=USAGE_BY[by])
        found = await self._worker.run(lambda db: db.execute(sql, (since,)).fetchall())
        return [
            {
                by: name,
                "requests": requests,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            for name, requests, prompt, completion in found
        ]

    def _write_pending(self, connection: sqlite3.Connection, final: bool) -> None:
        rows = self._pending.take(seal=final)
        if rows:
            try:
                with connection:  # one transaction for the batch
                    _insert(connection, list(rows))
            except (sqlite3.Error, OSError):
                self._pending.lost(len(rows))  # a full or read-only disk
                raise
        if self._clock() - self._pruned_at >= PRUNE_EVERY:
            self._prune(connection)

    def _prune(self, connection: sqlite3.Connection) -> None:
        now = self._clock()
        with connection:
            connection.execute(_OLDER_THAN, (now - self._max_age,))
            connection.execute(_BEYOND_NEWEST, (self._max_rows,))
        self._pruned_at = now


def _filters(
    model: str | None,
    key: str | None,
    instance: str | None,
    status: int | None,
    since: float | None,
    before: int | None,
) -> tuple[str, list[object]]:
    wanted = (
        ("model = ?", model),
        ('"key" = ?', key),
        ("instance = ?", instance),
        ("status = ?", status),
        ("at >= ?", since),
        ("id < ?", before),
    )
    given = [(clause, value) for clause, value in wanted if value is not None]
    if not given:
        return "", []
    return " WHERE " + " AND ".join(clause for clause, _ in given), [v for _, v in given]


def _insert(connection: sqlite3.Connection, rows: list[Row]) -> None:
    """Many rows per statement, not ``executemany``: SQLite lets go of the GIL at each step,
    and on a busy gateway each taking it back waits for the event loop's thread, which held
    the writer to about 2,000 rows a second (docs/benchmarks.md, the activity log)."""
    for at in range(0, len(rows), ROWS_PER_INSERT):
        batch = rows[at : at + ROWS_PER_INSERT]
        values = ", ".join([_ROW] * len(batch))
        flat = [value for row in batch for value in row]
        connection.execute(f"INSERT INTO activity ({_COLUMN_LIST}) VALUES {values}", flat)


def _values(activity: Activity) -> Row:
    return dataclasses.astuple(activity)


def _activity(values: tuple[Any, ...]) -> Activity:
    fields = dict(zip(_COLUMNS, values, strict=True))
    fields["stream"] = bool(fields["stream"])  # SQLite keeps it as 0 or 1
    return Activity(**fields)
