"""What swapgate needs of the operating system for the processes it starts: that they die with
it, how one ended (in words), and whether a port is free for the next one."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


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
