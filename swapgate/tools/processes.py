"""Starting the servers swapgate's tools run, and stopping them: the demo's simulators and
engines, ``swapgate replay``'s, the tests' and the benchmarks'. One way to start, to know it
serves, and to stop.

Every child gets PR_SET_PDEATHSIG, so it never outlives the process that started it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

from swapgate.drivers.children import die_with_parent, exit_name

STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
# A port ``free_port`` handed out is not handed to another caller on this machine (the suite's
# workers, a benchmark beside them) for this long: a server that starts slowly (vLLM, ~40 s)
# binds it well within that, instead of finding another's server on it.
RESERVED_FOR = 300.0


def sim_command(flavor: str, port: int, **options: object) -> list[str]:
    """``swapgate sim`` of ``flavor`` on ``port``; each option as its flag (``load_time=2``:
    ``--load-time 2``)."""
    command = [sys.executable, "-m", "swapgate", "sim", "--flavor", flavor, "--port", str(port)]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def start(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    log: Path | int | None = None,
    clean_env: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command`` with ``env`` added to ours (or alone, with ``clean_env``). Its output
    goes to the file ``log`` (tests read what it said), or to a descriptor such as DEVNULL."""
    output = log.open("wb") if isinstance(log, Path) else log
    try:
        return subprocess.Popen(
            list(command),
            env=dict(env or {}) if clean_env else {**os.environ, **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            preexec_fn=die_with_parent,
        )
    finally:
        if isinstance(log, Path) and output is not None and not isinstance(output, int):
            output.close()


def wait_until_serving(
    url: str, process: subprocess.Popen[bytes], timeout: float = STARTUP_TIMEOUT
) -> None:
    """Return once anything answers HTTP at ``url`` (an error status counts: it is serving)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            how = exit_name(process.returncode)
            raise RuntimeError(f"{process.args!r} for {url} exited with {how}")
        try:
            with urlopen(url, timeout=1):
                return
        except HTTPError:
            return
        except (URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"the server for {url} did not start within {timeout:g}s")


def stop(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM, and SIGKILL if it has not exited ``timeout`` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def serving(
    command: Sequence[str],
    ready_url: str,
    env: Mapping[str, str] | None = None,
    *,
    log: Path | int | None = None,
    clean_env: bool = False,
    timeout: float = STARTUP_TIMEOUT,
) -> Iterator[subprocess.Popen[bytes]]:
    """A server that answers at ``ready_url`` for the block, stopped when it ends."""
    process = start(command, env, log=log, clean_env=clean_env)
    try:
        wait_until_serving(ready_url, process, timeout)
        yield process
    finally:
        stop(process)


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
