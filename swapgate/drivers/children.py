"""What swapgate needs of the operating system for the processes it starts: that they die with
it, how one ended (in words), whether a port is free for the next one (and a port no other
caller on this machine is handed meanwhile), and stopping one. The engine builds beside the
package take these too: all standard library, so the builds need nothing from a higher layer.

Dying with it takes two parts (docs/process.md, "No orphans"). PR_SET_PDEATHSIG sends a server
SIGTERM when swapgate dies, but nothing follows up: a server that hangs in its shutdown
(llama-server has been seen asleep in a futex after it) or ignores the signal lives on, and so
does whatever it started in turn. So the guard, a small process started with the first server,
is told one line each on its stdin which process groups to watch and how long each may take to
stop (its command's ``stop_timeout``). When its stdin ends (swapgate exited, or was killed: the
kernel closes the pipe either way) it sends each group it still watches SIGTERM, waits until
the group is empty or its time is up, and SIGKILLs what is left.

The guard is this module run as a script (``python -I -S children.py``): it imports the
standard library only, starts in 40 ms of CPU and holds 14 MiB. ``Guard`` is swapgate's
side of the pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

log = logging.getLogger("swapgate.process")
POLL = 0.1  # seconds between the guard's looks at the groups while they stop
PR_SET_PDEATHSIG = 1
STOP_TIMEOUT = 10.0
# A port ``free_port`` handed out is not handed to another caller on this machine (the suite's
# workers, a benchmark beside them) for this long: a server that starts slowly (vLLM, ~40 s)
# binds it well within that, instead of finding another's server on it.
RESERVED_FOR = 300.0


def exit_name(returncode: int) -> str:
    """How a process ended, in words: ``SIGSEGV`` for a process killed by signal 11 (Python's
    returncode -11), ``SIGSEGV (exit code 139)`` where a shell or a supervisor said 128 + 11,
    ``exit code 1`` otherwise."""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        name = signal.Signals(number).name if number else ""
    except ValueError:
        name = ""
    if not name:
        return f"exit code {returncode}"
    return name if returncode < 0 else f"{name} (exit code {returncode})"


def die_with_parent() -> None:
    """Run in the child before exec: the kernel sends it SIGTERM when its parent dies, also
    when the parent is killed with SIGKILL or exits without cleaning up (uvicorn re-raises
    SIGTERM after its shutdown, which ends the process before any ``finally`` runs)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port``. SO_REUSEADDR as servers bind (uvicorn,
    llama-server): else the port a stopped server left in TIME_WAIT looks taken, and every
    start takes the next port up."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, and SIGKILL if it has not exited ``timeout`` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    """A loopback port nothing listens on now and no other caller on this machine was given
    in the last ``RESERVED_FOR`` seconds (the race with other programs applies: bind it soon)."""
    marks = Path(tempfile.gettempdir()) / f"swapgate-ports-{os.getuid()}"
    marks.mkdir(mode=0o700, exist_ok=True)
    for _ in range(100):
        port = _port_offered()
        if _reserve(marks / str(port)):
            break
    return port


def _port_offered() -> int:
    """A loopback port the kernel says is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _reserve(mark: Path) -> bool:
    """Take ``mark`` for this caller, unless another took it less than RESERVED_FOR ago."""
    try:
        if time.time() - mark.stat().st_mtime < RESERVED_FOR:
            return False
        mark.unlink(missing_ok=True)  # stale
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False  # another caller took it just now
    return True


class Guard:
    """swapgate's side: starts the guard with the first group it is told to watch. If the
    guard cannot start or dies, swapgate says so once and goes on without it (the kernel's
    SIGTERM and the ledger's sweep at the next start still apply)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._failed = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def watch(self, group: int, grace: float) -> None:
        self._say(f"watch {group} {grace:g}")

    def forget(self, group: int) -> None:
        if self._process is not None:
            self._say(f"forget {group}")

    def close(self) -> None:
        """Ends the guard's stdin; it stops what it still watches and exits."""
        process, self._process = self._process, None
        if process is not None and process.stdin is not None:
            process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):  # still stopping: goes on alone
                process.wait(timeout=1.0)

    def _say(self, line: str) -> None:
        if self._failed:
            return
        try:
            if self._process is None:
                self._process = _start()
            assert self._process.stdin is not None
            self._process.stdin.write(line.encode() + b"\n")
            self._process.stdin.flush()
        except OSError as exc:
            self._failed = True
            log.warning(
                "the guard that stops swapgate's servers if swapgate is killed is not running "
                "(%s); a server that ignores SIGTERM may outlive a killed swapgate until the "
                "next one starts",
                exc,
            )


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(__file__).resolve())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # not stopped with swapgate by a terminal's Ctrl-C
    )


def members(group: int) -> list[int]:
    """The live (not zombie) processes in process group ``group``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":  # state, ppid, pgrp, …
            found.append(int(entry.name))
    return found


def stop_all(groups: dict[int, float], say: IO[str]) -> None:
    """SIGTERM to every group, then SIGKILL to each still there after its grace."""
    started = time.monotonic()
    for group in groups:
        _signal(group, signal.SIGTERM)
    waiting = dict(groups)
    while waiting:
        for group, grace in list(waiting.items()):
            if not members(group):
                del waiting[group]
            elif time.monotonic() - started >= grace:
                _tell(say, f"process group {group} ignored SIGTERM for {grace:g}s: SIGKILL")
                _signal(group, signal.SIGKILL)
                del waiting[group]
        time.sleep(POLL)


def _tell(say: IO[str], what: str) -> None:
    with contextlib.suppress(OSError):  # swapgate's log may have gone with it
        print(f"swapgate guard: {what}", file=say, flush=True)


def _signal(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def run_guard(lines: IO[str], say: IO[str]) -> None:
    """Read ``watch GROUP GRACE`` and ``forget GROUP`` until the input ends; then stop what is
    still watched."""
    groups: dict[int, float] = {}
    for line in lines:
        try:
            match line.split():
                case ["watch", group, grace]:
                    groups[int(group)] = float(grace)
                case ["forget", group]:
                    groups.pop(int(group), None)
                case _:
                    raise ValueError
        except ValueError:
            _tell(say, f"ignoring {line.strip()!r}")
    stop_all(groups, say)


if __name__ == "__main__":
    run_guard(sys.stdin, sys.stderr)
