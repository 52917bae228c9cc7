"""Child processes that never outlive swapgate: the demo's servers, and the tests'."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in the child before exec: the kernel sends it SIGTERM when its parent dies, also
    when the parent is killed with SIGKILL or exits without cleaning up (uvicorn re-raises
    SIGTERM after its shutdown, which ends the process before any ``finally`` runs)."""
    if sys.platform == "linux":
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def start_child(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command), env=env, stdout=stdout, stderr=stderr, preexec_fn=die_with_parent
    )
