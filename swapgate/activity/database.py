"""One thread and one SQLite connection for the activity database, and the buffers feeding it.

The request path must never wait on the disk: it hands rows to a ``WriteBuffer`` (a lock and an
append) and returns. ``SqliteWorker`` owns the only connection, on its own thread, so an in-memory
database works and SQLite never sees two threads. Before each job, and at least every
``DRAIN_EVERY`` seconds, it drains every attached buffer (a transaction each); reads are jobs too,
so a read sees every row recorded before it was asked for.

The file holds whole prompts and answers (captures): it and its WAL are created 0600, its folder
0700, whatever the umask. Its layout has a version (``PRAGMA user_version``): an older file is
migrated forward when opened (``MIGRATIONS``), one from a newer swapgate is left alone and the
log kept in memory. A disk that is full or read-only loses rows, counted, and says so once a
minute; it never fails a request (docs/operations.md, "Activity").
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Row = TypeVar("Row")

# Seconds between drains while requests keep coming: what a crash may lose, never what a read
# sees (a read drains first). One transaction a second instead of four rewrites the table's
# last pages a quarter as often: 9 µs less CPU a request on the warm path, 0.87x -> 0.90x the
# bare passthrough (docs/benchmarks.md). A buffer of BUFFER_ROWS holds 10,000 requests a second.
DRAIN_EVERY = 1.0
WARN_EVERY = 60.0  # seconds between two warnings that rows cannot be written
# The database's layout; MIGRATIONS[n] takes a file from version n to n + 1. Version 1 is the
# first layout, which files from before versions had too (their user_version is 0).
SCHEMA_VERSION = 3


def _trace_ids(connection: sqlite3.Connection) -> None:
    """Version 2: each request's trace id (tracing), on a file that has an activity table."""
    tables = connection.execute("SELECT name FROM sqlite_master WHERE name = 'activity'")
    if tables.fetchone() is not None:
        connection.execute("ALTER TABLE activity ADD COLUMN trace_id TEXT")


def _fallbacks(connection: sqlite3.Connection) -> None:
    """Version 3: the model a request asked for when another answered it, and why."""
    tables = connection.execute("SELECT name FROM sqlite_master WHERE name = 'activity'")
    if tables.fetchone() is not None:
        connection.execute("ALTER TABLE activity ADD COLUMN fallback_from TEXT")
        connection.execute("ALTER TABLE activity ADD COLUMN fallback_reason TEXT")


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _trace_ids, 2: _fallbacks}

# Called on the worker thread with the connection, and True on the last call before closing.
WritePending = Callable[[sqlite3.Connection, bool], None]
_Job = tuple[Callable[[sqlite3.Connection], Any], Future[Any]]

_log = logging.getLogger(__name__)


class WriteBuffer(Generic[Row]):
    """Rows on their way to the database: bounded, so a stalled disk costs rows, never memory."""

    def __init__(self, capacity: int) -> None:
        self._rows: deque[Row] = deque()
        self._capacity = capacity
        self._lock = threading.Lock()
        self._sealed = False
        self._dropped = 0

    @property
    def dropped(self) -> int:
        """Rows refused because the buffer was full, or came after the database closed."""
        return self._dropped

    def lost(self, count: int) -> None:
        """``count`` rows taken for the database never reached it (a full or read-only disk)."""
        with self._lock:
            self._dropped += count

    def put(self, row: Row) -> bool:
        """Keep ``row`` for the writer; ``False`` (and counted) when there is no room."""
        with self._lock:
            if self._sealed or len(self._rows) >= self._capacity:
                self._dropped += 1
                return False
            self._rows.append(row)
            return True

    def take(self, *, seal: bool = False) -> deque[Row]:
        """Everything buffered; sealed, later rows are refused (the database is closing)."""
        with self._lock:
            # A swap, not a copy: the request path waits on this lock.
            rows, self._rows = self._rows, deque()
            self._sealed = self._sealed or seal
            return rows


class SqliteWorker:
    """The activity database's only connection, used from its own thread alone."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writers: tuple[WritePending, ...] = ()  # touched on the worker thread only
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._finished: Future[None] = Future()
        self._warned_at = -WARN_EVERY  # when a failed write was last told (worker thread)
        self.failed_writes = 0  # batches that could not be written

    def attach(self, schema: str, write_pending: WritePending) -> None:
        """Create a table's schema, then call ``write_pending`` whenever buffers are drained."""

        def install(connection: sqlite3.Connection) -> None:
            connection.executescript(schema)
            self._writers = (*self._writers, write_pending)

        self._enqueue(install)

    def start(self) -> None:
        """Open the database on the worker thread (in memory, with a warning, when its file
        cannot be opened)."""
        opened: Future[None] = Future()
        with self._lock:
            if self._thread is not None or self._closing:
                return
            self._thread = threading.Thread(
                target=self._run, args=(opened,), name="activity-db", daemon=True
            )
            self._thread.start()
        opened.result()

    def call(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` on the worker thread and wait for it (tests, shutdown)."""
        self._require_started()
        return self._enqueue(job).result()

    async def run(self, job: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``job`` on the worker thread without blocking the event loop."""
        self._require_started()
        return await asyncio.wrap_future(self._enqueue(job))

    async def close(self) -> None:
        """Write what is buffered, then close the connection; idempotent."""
        with self._lock:
            first, self._closing = not self._closing, True
            started = self._thread is not None
        if not started:
            return
        if first:
            self._jobs.put(None)
        await asyncio.wrap_future(self._finished)

    def _require_started(self) -> None:
        if self._thread is None:
            raise RuntimeError("the activity database is not started")

    def _enqueue(self, job: Callable[[sqlite3.Connection], T]) -> Future[T]:
        done: Future[T] = Future()
        with self._lock:  # so that nothing is queued behind the closing job, never to run
            if self._closing:
                raise RuntimeError("the activity database is closed")
            self._jobs.put((job, done))
        return done

    def _run(self, opened: Future[None]) -> None:
        try:
            connection = self._connect()
        except Exception as error:
            with self._lock:
                self._closing = True
            self._finished.set_result(None)
            opened.set_exception(error)
            return
        opened.set_result(None)
        try:
            self._serve(connection)
        finally:
            # Resolved only once closed: a file database is complete (WAL folded in) by then.
            connection.close()
            self._finished.set_result(None)

    def _connect(self) -> sqlite3.Connection:
        _bind_directly()
        if self._path is None:
            return sqlite3.connect(":memory:")
        try:
            return self._connect_file(self._path)
        except (OSError, sqlite3.Error) as error:
            # No place for it on disk: kept for as long as the gateway runs, rather than none.
            _log.warning(
                "activity log: %s cannot be opened (%s); kept in memory", self._path, error
            )
            return sqlite3.connect(":memory:")

    @staticmethod
    def _connect_file(path: Path) -> sqlite3.Connection:
        _private(path)
        connection = sqlite3.connect(path)
        try:
            migrate(connection)  # first: a file from a newer swapgate is not touched
            # WAL: readers and the writer don't block each other; NORMAL: no fsync per commit,
            # a crash may lose the last rows but never corrupts the file. SQLite gives the WAL
            # and its index the database file's own mode.
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            connection.close()
            raise
        return connection

    def _serve(self, connection: sqlite3.Connection) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=DRAIN_EVERY)
            except queue.Empty:
                self._drain(connection, final=False)
                continue
            self._drain(connection, final=job is None)
            if job is None:
                return
            _perform(connection, *job)

    def _drain(self, connection: sqlite3.Connection, *, final: bool) -> None:
        for write_pending in self._writers:
            try:
                write_pending(connection, final)
            except (sqlite3.Error, OSError) as error:
                # A full or read-only disk must not end the thread, nor fill the log: these
                # rows are lost (the writer counted them), later ones may land.
                self.failed_writes += 1
                now = time.monotonic()
                if now - self._warned_at >= WARN_EVERY:
                    self._warned_at = now
                    _log.warning(
                        "activity log: rows cannot be written (%s): they are dropped and counted "
                        "(/admin/activity's dropped) until they can; said at most once a minute",
                        error,
                    )
            except Exception:
                _log.exception("activity database: writing buffered rows failed")


def _bind_directly() -> None:
    """Bind None and bool through an adapter: without one, sqlite3 looks each up as a protocol
    first and formats an AttributeError it then drops, ~0.15 µs a value, about five a row.
    Process-wide, and what SQLite stores is unchanged (NULL; 0 or 1)."""
    sqlite3.register_adapter(type(None), _same)
    sqlite3.register_adapter(bool, int)


def _same(value: None) -> None:
    return value


def _private(path: Path) -> None:
    """The database's folder 0700 when swapgate makes it, and its files 0600, whatever the
    umask: they hold whole prompts and answers."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # one made before this was 0644
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.chmod(0o600)


def migrate(connection: sqlite3.Connection) -> None:
    """Bring the file's layout to ``SCHEMA_VERSION``; raise ``sqlite3.DatabaseError`` for a
    file from a newer swapgate (it is left as it is)."""
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    tables = connection.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
    if not tables.fetchone()[0]:
        version = SCHEMA_VERSION  # a new file: its tables are made in the latest layout
    version = version or 1  # a file from before versions: the first layout
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(
            f"its layout is version {version}, newer than this swapgate's {SCHEMA_VERSION}: "
            "a newer swapgate wrote it; upgrade, or set activity.path to another file"
        )
    with connection:
        for step in range(version, SCHEMA_VERSION):
            MIGRATIONS[step](connection)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _perform(
    connection: sqlite3.Connection, job: Callable[[sqlite3.Connection], T], done: Future[T]
) -> None:
    if not done.set_running_or_notify_cancel():
        return  # its awaiter was cancelled
    try:
        result = job(connection)
    except Exception as error:
        done.set_exception(error)
    else:
        done.set_result(result)
