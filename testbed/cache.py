"""The cache the test engines are built into, once per machine (``~/.cache/swapgate``, or
``$SWAPGATE_ENGINE_CACHE``), outside ``.venv``: where each lies, a build run once however many
processes ask at once, and a command that says what failed (testbed/engines.py,
testbed/traces.py, testbed/big_gguf.py)."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "SWAPGATE_ENGINE_CACHE"


def cache_root() -> Path:
    if override := os.environ.get(CACHE_ENV):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swapgate"


def once(
    root: Path,
    what: str,
    say: bool,
    build: Callable[[], None],
    takes: str = "~7 min",
    flags: Sequence[str] = (),
) -> None:
    """Run ``build``, which fills ``root``, unless an earlier run on this machine did; safe to
    call from several processes at once (one builds, the others wait for it). ``flags``: what
    it was built with, recorded in ``build-flags.json`` (they are in ``root``'s name too, so
    other flags make another root); the same engine's other roots go once this one is built."""
    with locked(root.with_name(root.name + ".lock")):
        if (root / ".ready").exists():
            return
        if say:
            print(
                f"building {what} into {root} (once per machine; {takes} on 2 cores)",
                file=sys.stderr,
                flush=True,
            )
        started = time.monotonic()
        build()
        took = time.monotonic() - started
        if flags:
            record = {"engine": what, "machine": platform.machine(), "flags": list(flags)}
            (root / "build-flags.json").write_text(json.dumps(record, indent=2) + "\n")
        (root / ".ready").write_text(f"built in {took:.0f}s\n")
        if say:
            print(f"{what} ready in {took:.0f}s", file=sys.stderr, flush=True)
    if flags:
        _prune_others(root)


def _prune_others(root: Path) -> None:
    """Remove the same engine's caches built with other flags (or before flags were part of
    the key): they are never used again, and each holds hundreds of megabytes."""
    stem = root.name.rsplit("-", 1)[0]
    for other in root.parent.glob(f"{stem}*"):
        ours = re.fullmatch(re.escape(stem) + r"(-[0-9a-f]{10})?", other.name)
        if ours and other != root and other.is_dir():
            with locked(other.with_name(other.name + ".lock")):
                shutil.rmtree(other, ignore_errors=True)
            other.with_name(other.name + ".lock").unlink(missing_ok=True)


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise RuntimeError(f"{' '.join(command[:4])}… failed ({result.returncode}):\n{tail}")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
