"""The conversations saved for one ``kv_keep`` instance (docs/kv-keep.md, "Never restores a
file into another model"): the engine writes ``MODEL--KEY.bin`` into its slot-save folder;
beside it swapgate writes ``MODEL--KEY.bin.identity``, the identity of the engine that made it,
so that a file is never restored into another model (llama.cpp checks only that the shapes
fit). The folder is 0700 and swapgate's files 0600: the token ids in a saved slot decode back
to the conversation."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

log = logging.getLogger("swapgate.kv")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
IDENTITY = ".identity"


class Found(Enum):
    NONE = "none"  # nothing saved for the conversation
    STALE = "stale"  # saved by another engine or model: removed
    SAVED = "saved"  # its file, made by this engine


@dataclass(frozen=True, slots=True)
class Saved:
    path: Path
    size: int
    used: float  # its mtime: when it was last saved or restored


class SavedFiles:
    def __init__(self, folder: Path, budget: int) -> None:
        self.folder = folder
        self.budget = budget

    def create(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a folder the operator shares with the engine
            self.folder.chmod(0o700)

    def name(self, model: str, key: str) -> str:
        return f"{_UNSAFE.sub('_', model)}--{key}.bin"

    def find(self, model: str, key: str, identity: str) -> Found:
        """Whether conversation ``key`` of ``model`` was saved by the engine ``identity``;
        a file saved by another is removed."""
        path = self.folder / self.name(model, key)
        if not path.exists():
            return Found.NONE
        try:
            made_by = (self.folder / (path.name + IDENTITY)).read_text().strip()
        except OSError:
            made_by = ""
        if made_by == identity:
            return Found.SAVED
        self._remove(path)
        log.info("%s: removed %s, saved by another model or engine", self.folder, path.name)
        return Found.STALE

    def made(self, model: str, key: str, identity: str) -> int | None:
        """The engine saved ``key``: record who made it; returns the file's size, or None
        when the file is not in the folder (the engine saves elsewhere)."""
        path = self.folder / self.name(model, key)
        try:
            size = path.stat().st_size
        except OSError:
            return None
        mark = self.folder / (path.name + IDENTITY)
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(identity)
        with contextlib.suppress(OSError):
            path.chmod(0o600)  # the engine made it with its own umask
        return size

    def rank(self, model: str, keys: list[str]) -> None:
        """Saved together, ``keys`` most recently used first: the budget keeps them in that
        order (the first saved is the last to go)."""
        now = time.time()
        for age, key in enumerate(keys):
            with contextlib.suppress(OSError):
                os.utime(self.folder / self.name(model, key), (now - age, now - age))

    def used(self, model: str, key: str) -> None:
        """Restored: the last to go past the budget."""
        with contextlib.suppress(OSError):
            os.utime(self.folder / self.name(model, key))

    def listing(self) -> list[Saved]:
        found = []
        for path in self.folder.glob("*--*.bin"):
            with contextlib.suppress(OSError):
                stat = path.stat()
                found.append(Saved(path, stat.st_size, stat.st_mtime))
        return found

    def trim(self) -> None:
        """Past the budget, the least recently used files go."""
        files = sorted(self.listing(), key=lambda saved: saved.used)
        total = sum(saved.size for saved in files)
        for saved in files:
            if total <= self.budget:
                break
            self._remove(saved.path)
            total -= saved.size
            log.info(
                "%s: dropped the saved conversation %s (kv_keep budget)",
                self.folder,
                saved.path.name,
            )

    def _remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        (path.parent / (path.name + IDENTITY)).unlink(missing_ok=True)
