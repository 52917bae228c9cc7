"""A record on disk of the server processes swapgate started, so that none outlives it.

When swapgate dies, SIGKILL included, the kernel sends each process it started SIGTERM
(PR_SET_PDEATHSIG) and the guard (swapgate/drivers/children.py) stops each whole group, SIGKILL
after its grace. Where both were out of reach (the guard killed too, a machine that lost
power mid-shutdown), the groups are on disk: each process is recorded while it runs; at start,
swapgate stops every group whose recording swapgate is gone (the same pid with the same start
time would still be alive), and drops the record. A live swapgate's processes are never touched.

The records live in ``$SWAPGATE_STATE_DIR``, else ``$XDG_STATE_HOME/swapgate/processes``, else
``~/.local/state/swapgate/processes``; one small JSON file per process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from swapgate.drivers.children import Guard

log = logging.getLogger("swapgate.process")


@dataclass(frozen=True)
class Record:
    pid: int  # the group leader: its pid is the group's id
    started: float  # its start time, which tells it from a later process with the same pid
    owner: int  # the swapgate that started it, and that one's start time
    owner_started: float
    instance: str
    model: str


class Ledger:
    """The records of one swapgate process, and its ``Guard`` (which stops the groups at once
    when swapgate dies, SIGKILL after each one's grace). ``Ledger(None)`` records nothing."""

    def __init__(self, directory: Path | None, guard: Guard | None = None) -> None:
        self._directory = directory
        self._guard = guard
        self._me = psutil.Process()

    def record(self, pid: int, instance: str, model: str, grace: float) -> None:
        """``pid`` leads a group swapgate started; ``grace``: how long it may take to stop."""
        if self._guard is not None:
            self._guard.watch(pid, grace)
        if self._directory is None:
            return
        try:
            started = psutil.Process(pid).create_time()
            record = Record(pid, started, self._me.pid, self._me.create_time(), instance, model)
            self._directory.mkdir(parents=True, exist_ok=True)
            self._path(pid).write_text(json.dumps(asdict(record)))
        except (OSError, psutil.Error) as exc:
            log.warning(
                "cannot record %s/%s (pid %d) in %s: %s; a killed swapgate may leave its "
                "children behind",
                instance,
                model,
                pid,
                self._directory,
                exc,
            )

    def forget(self, pid: int) -> None:
        if self._guard is not None:
            self._guard.forget(pid)
        if self._directory is not None:
            with contextlib.suppress(OSError):
                self._path(pid).unlink()

    def close(self) -> None:
        """At swapgate's shutdown, once every group it started has stopped."""
        if self._guard is not None:
            self._guard.close()

    def sweep(self) -> list[Record]:
        """Stop what a swapgate that is gone left behind; return the records it stopped."""
        if self._directory is None or not self._directory.is_dir():
            return []
        swept = []
        for path in sorted(self._directory.glob("*.json")):
            record = _read(path)
            if record is not None and _alive(record.owner, record.owner_started):
                continue  # a running swapgate's own
            if record is not None and _stop_group(record):
                log.warning(
                    "stopped what %s/%s (pid %d) left behind when its swapgate (pid %d) was killed",
                    record.instance,
                    record.model,
                    record.pid,
                    record.owner,
                )
                swept.append(record)
            with contextlib.suppress(OSError):
                path.unlink()
        return swept

    def _path(self, pid: int) -> Path:
        assert self._directory is not None
        return self._directory / f"{self._me.pid}-{pid}.json"


def _read(path: Path) -> Record | None:
    try:
        return Record(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring the unreadable process record %s: %s", path, exc)
        return None


def _alive(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.01 and (
            process.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def _stop_group(record: Record) -> bool:
    """SIGKILL every process still in the record's group that is not older than the group."""
    stopped = False
    for process in psutil.process_iter():
        try:
            if (
                os.getpgid(process.pid) != record.pid
                or process.create_time() < record.started - 0.01
            ):
                continue
            process.send_signal(signal.SIGKILL)
            stopped = True
        except (OSError, psutil.Error):
            continue
    return stopped
