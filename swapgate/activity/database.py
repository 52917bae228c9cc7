"""One thread and one SQLite connection for the activity database, and the buffers feeding it.

The request path must never wait on the disk: it hands rows to a ``WriteBuffer`` (a lock and an
append) and returns. ``SqliteWorker`` owns the only connection, on its own thread, so an in-memory
database works and SQLite never sees two threads. Before each job, and at least every
``DRAIN_EVERY`` seconds, it drains every attached buffer (a transaction each); reads are jobs too,
so a read sees every row recorded before it was asked for.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Row = TypeVar("Row")

DRAIN_EVERY = 0.25  # seconds: how stale the database may be while requests keep coming

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
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path)
        # WAL: readers and the writer don't block each other; NORMAL: no fsync per commit, a
        # crash may lose the last rows but never corrupts the file.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
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
            except Exception:
                # A full disk must not end the thread: these rows are lost, later ones may land.
                _log.exception("activity database: writing buffered rows failed")


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
