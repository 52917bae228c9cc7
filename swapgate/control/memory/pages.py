"""A file's pages in the host's page cache (docs/host-cache.md): how much of it is resident
(``mincore``), bringing it in (a sequential, throttled read) and letting it go
(``POSIX_FADV_DONTNEED``). Linux; elsewhere residency is unknown and nothing is read."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

PAGE = mmap.PAGESIZE
CHUNK = 8 << 20  # bytes per read while a file is brought in
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc: ctypes.CDLL | None = None
if sys.platform == "linux":
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    _libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    _libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)


def size(path: Path) -> int | None:
    """Bytes of ``path``; None if it cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def resident(path: Path) -> int | None:
    """Bytes of ``path`` in the page cache now (``mincore`` over a read-only mapping that
    touches nothing); None where it cannot be told (not Linux, no such file)."""
    if _libc is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        address = _libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            return None
        try:
            pages = (size + PAGE - 1) // PAGE
            vector = ctypes.create_string_buffer(pages)
            if _libc.mincore(address, size, vector) != 0:
                return None
            count = pages - vector.raw.count(0)  # a page in the cache: its byte is 1
        finally:
            _libc.munmap(address, size)
        return min(size, count * PAGE)
    finally:
        os.close(fd)


def bring_in(
    path: Path,
    rate: float,
    may_go_on: Callable[[], bool] = lambda: True,
    read_so_far: Callable[[int], None] = lambda _: None,
) -> int:
    """Read ``path`` from start to end at most ``rate`` bytes a second, so that its pages are
    in the page cache; stop early (returning the bytes read) whenever ``may_go_on`` says no
    (a load runs on the same disk). ``read_so_far`` hears the bytes read after each chunk: the
    first that many bytes are resident. Runs in a thread: it blocks."""
    done = 0
    started = time.monotonic()
    buffer = bytearray(CHUNK)
    with path.open("rb", buffering=0) as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while may_go_on():
            count = handle.readinto(buffer)
            if not count:
                break
            done += count
            read_so_far(done)
            ahead = done / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return done


def let_go(path: Path) -> None:
    """Ask the kernel to drop ``path``'s pages from the page cache (clean pages go at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
