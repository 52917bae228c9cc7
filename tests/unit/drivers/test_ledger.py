"""The record of started processes (swapgate/drivers/ledger.py): a killed swapgate's leftovers
are stopped at the next start, a live one's never."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from swapgate.drivers.ledger import Ledger


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A process group of two: a shell leading it and its background ``sleep``."""
    leader = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & wait"], start_new_session=True)
    deadline = time.monotonic() + 5
    while len(members(leader.pid)) < 2 and time.monotonic() < deadline:  # the shell forks first
        time.sleep(0.01)
    assert len(members(leader.pid)) == 2, "the shell did not start its sleep within 5 s"
    yield leader
    subprocess.run(["pkill", "-KILL", "-g", str(leader.pid)], check=False)
    leader.wait()


def members(leader: int) -> list[int]:
    """The live processes of the group (a killed orphan may stay a zombie for a while)."""
    alive = []
    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
    return alive


def test_a_live_swapgates_processes_are_left_alone(tmp_path: Path, group) -> None:
    ledger = Ledger(tmp_path)
    ledger.record(group.pid, "node", "a", 10.0)
    assert Ledger(tmp_path).sweep() == []
    assert group.poll() is None
    assert len(list(tmp_path.iterdir())) == 1
    ledger.forget(group.pid)
    assert list(tmp_path.iterdir()) == []


def test_a_dead_swapgates_group_is_killed_whole_and_its_record_dropped(
    tmp_path: Path, group
) -> None:
    Ledger(tmp_path).record(group.pid, "node", "a", 10.0)
    (path,) = tmp_path.iterdir()
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "owner_started": record["owner_started"] - 60}))
    assert len(members(group.pid)) == 2
    (swept,) = Ledger(tmp_path).sweep()
    assert (swept.instance, swept.model, swept.pid) == ("node", "a", group.pid)
    assert group.wait(timeout=5) == -9
    deadline = time.monotonic() + 5
    while members(group.pid) and time.monotonic() < deadline:  # SIGKILL takes a moment
        time.sleep(0.02)
    assert members(group.pid) == []
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_record_is_dropped_and_nothing_is_killed(tmp_path: Path, group) -> None:
    (tmp_path / "1-2.json").write_text("{not json")
    assert Ledger(tmp_path).sweep() == []
    assert list(tmp_path.iterdir()) == []
    assert group.poll() is None


def test_without_a_directory_nothing_is_recorded(group) -> None:
    ledger = Ledger(None)
    ledger.record(group.pid, "node", "a", 10.0)
    assert ledger.sweep() == []
