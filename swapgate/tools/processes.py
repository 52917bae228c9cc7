"""Starting the servers swapgate's tools run, and stopping them: the demo's simulators and
engines, ``swapgate replay``'s, the tests' and the benchmarks'. One way to start, to know it
serves, and to stop.

Every child gets PR_SET_PDEATHSIG, so it never outlives the process that started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import urlopen

# free_port and stop live with the OS primitives, where testbed/ takes them too
from swapgate.drivers.children import die_with_parent, exit_name, free_port, stop

__all__ = [
    "free_port",
    "serving",
    "sim_command",
    "start",
    "stop",
    "wait_until_serving",
]

STARTUP_TIMEOUT = 20.0


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
