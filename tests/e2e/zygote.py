"""Gateways and simulators forked from a process that has imported swapgate already.

Most of a test gateway's start is Python importing FastAPI, uvicorn, aiohttp, pydantic and
swapgate (about 0.6 of its 0.74 CPU-seconds); the suite starts hundreds. Each pytest worker
starts one zygote, ``python -m tests.e2e.zygote FD``, which imports all of it once and then forks
a child per ``swapgate ARGS`` asked for over a Unix socket. The child takes the environment,
working directory and output it is given, runs ``swapgate.tools.cli.main`` and exits the way
``python -m swapgate`` would: non-daemon threads joined, ``atexit`` run, output flushed, a
``SystemExit`` code or a signal as its status.

What the tests see is a :class:`Forked`, a ``subprocess.Popen`` whose ``pid`` is the gateway's
own (signals, psutil, its process group all work on it). The zygote reaps it and sends its wait
status down a pipe only that handle reads. A forked child dies with the zygote, the zygote with
the worker (PR_SET_PDEATHSIG at each step).

What a fork shares with its siblings and a fresh process would not: the hash seed and anything
a module computed at import (``tempfile``'s folder excepted: the child looks it up again in its
own TMPDIR). swapgate reads its environment when it runs, not at import, and nothing it keeps
across replicas uses ``hash()``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swapgate.drivers.children import die_with_parent

STATUS = struct.Struct("i")  # a wait status, as os.waitpid gives it
MAX_MESSAGE = 1 << 20
# What ``serve`` and ``sim`` import as they run, imported once here: the first five on the
# gateway's first control call and app build (httpx's transport, httpcore with the trio and
# anyio it finds installed, h11, certifi; FastAPI's pydantic.v1 shim), 0.1 of the 0.23
# CPU-seconds a forked gateway took to start; the next three as each child runs.
WARM = (
    "httpcore",
    "h11",
    "anyio._backends._asyncio",
    "certifi",
    "pydantic.v1",
    "encodings.idna",  # a URL's host, and the stringprep it imports
    "apscheduler.executors.asyncio",
    "swapgate.tools.cli",
    "swapgate.server.serve",
    "swapgate.server.runtime",
    "swapgate.sim",
    "swapgate.config.loading",
    "swapgate.cluster.store",
    "uvicorn.loops.auto",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.lifespan.on",
)


# -- the zygote ------------------------------------------------------------------------------


def _zygote(fd: int) -> None:
    import importlib

    for module in WARM:
        importlib.import_module(module)
    control = socket.socket(fileno=fd)
    woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    signal.set_wakeup_fd(woken_w)
    statuses: dict[int, int] = {}  # child pid -> the write end of its status pipe
    while True:
        ready, _, _ = select.select([control.fileno(), woken_r], [], [])
        if woken_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(woken_r, 4096)
            _reap(statuses)
        if control.fileno() in ready:
            message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
            if not message:
                return  # the worker is gone; its children die with us
            try:
                pid = os.fork()
            except OSError as exc:
                for received in fds:
                    os.close(received)
                control.send(json.dumps({"error": str(exc)}).encode())
                continue
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for mine in (woken_r, woken_w, *statuses.values()):
                    os.close(mine)
                control.close()
                os._exit(_child(json.loads(message), *fds))
            os.close(fds[0])
            os.close(fds[1])
            statuses[pid] = fds[2]
            control.send(json.dumps({"pid": pid}).encode())


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            os.write(fd, STATUS.pack(status))
            os.close(fd)


def _child(request: dict[str, Any], stdout: int, stderr: int, status: int) -> int:
    """Becomes ``python -m swapgate ARGS``; returns the exit code."""
    os.close(status)
    die_with_parent()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {null, stdout, stderr} - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read again from this environment's TMPDIR, as a new process would
    sys.argv = [request["argv0"], *request["args"]]
    code = _run(request["args"])
    threading._shutdown()  # type: ignore[attr-defined] # as the interpreter does at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _run(args: list[str]) -> int:
    from swapgate.tools.cli import main

    try:
        return main(args)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1


# -- the worker's side -----------------------------------------------------------------------


class Forked(subprocess.Popen[bytes]):
    """A child of the zygote, as the ``Popen`` the tests already hold. Only what they use:
    ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, signals."""

    def __init__(self, args: list[str], pid: int, status: int) -> None:
        # Popen.__init__ starts a process; this one is started already.
        self.args = args
        self.pid = pid
        self.returncode = None
        self.stdin = self.stdout = self.stderr = None
        self._status = status
        self._child_created = False  # Popen.__del__: nothing of ours to reap
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.returncode is not None:
                return self.returncode
            ready, _, _ = select.select([self._status], [], [], timeout)
            if not ready:
                return None
            data = os.read(self._status, STATUS.size)
            os.close(self._status)
            # No status at all: the zygote died, and its children with it (SIGTERM).
            status = STATUS.unpack(data)[0] if data else signal.SIGTERM
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def __del__(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.close(self._status)


class Zygote:
    """This worker's zygote, started at its first fork and stopped when the worker exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def fork(
        self, args: Sequence[str], env: Mapping[str, str], output: Path | None
    ) -> subprocess.Popen[bytes]:
        """``swapgate ARGS`` with ``env`` added to ours, its output to the file ``output`` (or
        ours)."""
        request = {
            "args": list(args),
            "argv0": str(Path(__file__).parents[2] / "swapgate" / "__main__.py"),
            "env": {**os.environ, **env},
            "cwd": os.getcwd(),
        }
        status_r, status_w = os.pipe()
        log = output.open("wb") if output is not None else None
        out = log.fileno() if log is not None else sys.stdout.fileno()
        err = log.fileno() if log is not None else sys.stderr.fileno()
        try:
            with self._lock:
                control = self._started()
                socket.send_fds(control, [json.dumps(request).encode()], [out, err, status_w])
                answer = json.loads(control.recv(MAX_MESSAGE) or b'{"error": "it exited"}')
        finally:
            os.close(status_w)
            if log is not None:
                log.close()
        if "pid" not in answer:
            os.close(status_r)
            raise RuntimeError(f"the test zygote could not fork swapgate: {answer['error']}")
        command = [sys.executable, "-m", "swapgate", *args]
        return Forked(command, answer["pid"], status_r)

    def _started(self) -> socket.socket:
        if self._socket is None:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.zygote", str(theirs.fileno())],
                cwd=Path(__file__).parents[2],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
            theirs.close()
            self._socket = mine
            atexit.register(self.close)
        return self._socket

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()  # the zygote reads the end and exits
            self._socket = None
        if self._process is not None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None


ZYGOTE = Zygote()


if __name__ == "__main__":
    _zygote(int(sys.argv[1]))
