"""The guard (swapgate/drivers/children.py): once the swapgate that started it is gone, however
it went, every group it still watches gets SIGTERM, and SIGKILL after its grace."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from swapgate.drivers.children import Guard, members, run_guard

# An owner like swapgate: it starts two groups and tells its guard of them, then waits to be
# killed. No PR_SET_PDEATHSIG here: whatever stops the groups is the guard's doing.
OWNER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from swapgate.drivers.children import Guard
    def group(line):
        return subprocess.Popen(["/bin/sh", "-c", line], start_new_session=True)
    polite = group("sleep 300 & wait")  # exits on SIGTERM
    stubborn = group("trap '' TERM; sleep 300 & wait")  # ignores it, and so does its sleep
    guard = Guard()
    guard.watch(polite.pid, 60)
    guard.watch(stubborn.pid, 1.5)
    print(json.dumps([polite.pid, stubborn.pid, guard.pid]), flush=True)
    time.sleep(300)
    """
)


def until(condition, timeout: float) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"not within {timeout}s"
        time.sleep(0.02)
    return time.monotonic() - started


def both_started(group: int) -> bool:
    return len(members(group)) == 2  # the shell and its sleep


def test_a_killed_owners_groups_stop_sigterm_first_sigkill_after_their_grace() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as owner:
        assert owner.stdout is not None
        polite, stubborn, guard = json.loads(owner.stdout.readline())
        try:
            until(lambda: both_started(polite) and both_started(stubborn), timeout=10)
            owner.kill()
            assert until(lambda: not members(polite), timeout=10) < 5, "SIGTERM, not 60 s"
            took = until(lambda: not members(stubborn), timeout=10)
            assert took > 1.0, "SIGKILL only after the grace"
            until(lambda: not members(guard), timeout=5)  # and the guard is gone too
        finally:
            for group in (polite, stubborn):
                subprocess.run(["pkill", "-KILL", "-g", str(group)], check=False)
        _, said = owner.communicate()  # what the guard said, on the owner's stderr
    assert f"process group {stubborn} ignored SIGTERM for 1.5s: SIGKILL" in said.decode()
    assert f"process group {polite}" not in said.decode()


def test_a_forgotten_group_is_left_alone_and_close_stops_the_rest() -> None:
    kept = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & wait"], start_new_session=True)
    stopped = subprocess.Popen(["/bin/sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        until(lambda: both_started(kept.pid) and both_started(stopped.pid), timeout=10)
        guard = Guard()
        guard.watch(kept.pid, 5)
        guard.watch(stopped.pid, 5)
        guard.forget(kept.pid)
        guard.close()
        until(lambda: not members(stopped.pid), timeout=5)
        time.sleep(0.3)
        assert len(members(kept.pid)) == 2
        assert kept.poll() is None
    finally:
        for group in (kept, stopped):
            subprocess.run(["pkill", "-KILL", "-g", str(group.pid)], check=False)
            group.wait()


def test_the_guard_names_a_line_it_does_not_understand() -> None:
    said = io.StringIO()
    run_guard(io.StringIO("watch 0x10 5\nhello\nforget 12\n"), said)  # 0x10: not a number
    assert "ignoring 'watch 0x10 5'" in said.getvalue()
    assert "ignoring 'hello'" in said.getvalue()


def test_a_guard_that_cannot_start_is_said_once_and_swapgate_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    guard = Guard()
    with caplog.at_level(logging.WARNING, "swapgate.process"):
        guard.watch(os.getpid(), 5)
        guard.watch(os.getpid(), 5)
        guard.forget(os.getpid())
        guard.close()
    (record,) = caplog.records
    assert "a server that ignores SIGTERM may outlive a killed swapgate" in record.getMessage()
    assert guard.pid is None


def test_members_are_the_live_processes_of_a_group() -> None:
    group = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert members(group.pid) == [group.pid]
        os.killpg(group.pid, signal.SIGKILL)
        group.wait()
        assert members(group.pid) == []
    finally:
        if group.poll() is None:
            group.kill()
