"""Conversations that survive swaps (docs/kv-keep.md): on a ``kv_keep`` instance running
llama.cpp's llama-server (``kind: process``, or ``llama-router``), each slot's KV cache is saved
to a file before its model is unloaded, keyed by the conversation it holds, and restored into a
slot when a turn of that conversation comes back; the turn is sent to that slot (``id_slot``),
so the engine reads only its new tokens.

swapgate assigns the slots itself: a conversation keeps its slot while its model stays loaded
(a new one takes a slot no conversation holds, else the least recently used one). Files are
named ``MODEL--KEY.bin`` in the instance's folder under ``kv_keep.dir``; past ``budget`` the
least recently used go. A save or a restore that fails is logged and counted, never the
request's failure: the turn is then served by reading its whole prompt.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from swapgate.config.settings import InstanceConfig, KvKeepConfig
from swapgate.metrics import Metrics

log = logging.getLogger("swapgate.kv")
TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a save waits for its slot's running answer
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class Server:
    """Where a model's slots are: its own server (``process``), or a router's, which takes the
    model by name (a ``model`` query to GET, a ``model`` field to POST)."""

    url: str
    model: str
    routed: bool
    headers: dict[str, str] = field(default_factory=dict)

    def slots(self) -> tuple[str, dict[str, str]]:
        return f"{self.url}/slots", ({"model": self.model} if self.routed else {})

    def action(self, slot: int, action: str, filename: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"filename": filename}
        if self.routed:
            body["model"] = self.model
        return f"{self.url}/slots/{slot}?action={action}", body


@dataclass
class _Book:
    """One loaded model's slots: which conversation each holds, least recently used first."""

    count: int | None = None  # how many slots its server has (GET /slots), once asked
    holds: OrderedDict[int, str] = field(default_factory=OrderedDict)


class KvKeeper:
    def __init__(self, client: httpx.AsyncClient, metrics: Metrics) -> None:
        self._client = client
        self._metrics = metrics
        self._configs: dict[str, KvKeepConfig] = {}
        self._routed: set[str] = set()
        self._books: dict[tuple[str, str], _Book] = {}

    def configure(self, instances: list[InstanceConfig]) -> None:
        self._configs = {i.name: i.kv_keep for i in instances if i.kv_keep is not None}
        self._routed = {i.name for i in instances if i.kind == "llama-router"}
        for name in self._configs:
            self.folder(name).mkdir(parents=True, exist_ok=True)
            self._export(name)

    def keeps(self, instance: str) -> bool:
        return instance in self._configs

    def server(
        self, instance: str, url: str, model: str, headers: dict[str, str] | None = None
    ) -> Server:
        """``model``'s slots on ``instance``: at ``url``, its own server or its router's."""
        return Server(url, model, instance in self._routed, dict(headers or {}))

    def folder(self, instance: str) -> Path:
        """Where ``instance``'s conversations are saved (its llama-server's --slot-save-path)."""
        return Path(self._configs[instance].dir).expanduser() / instance

    # -- around a model's load and unload --------------------------------------------------------

    def loaded(self, instance: str, model: str) -> None:
        """``model`` was (re)started on ``instance``: its slots are empty."""
        self._books.pop((instance, model), None)

    async def save(self, instance: str, model: str, server: Server) -> None:
        """Before ``model`` leaves ``instance``: save each slot that holds a conversation."""
        book = self._books.pop((instance, model), None)
        if book is None or not self.keeps(instance):
            return
        for slot, key in book.holds.items():
            url, body = server.action(slot, "save", _filename(model, key))
            result = "ok"
            try:
                answer = await self._client.post(url, json=body, headers=server.headers,
                                                 timeout=TIMEOUT)  # fmt: skip
                answer.raise_for_status()
            except httpx.HTTPError as exc:
                result = "failed"
                log.warning("%s/%s: saving slot %d failed: %s", instance, model, slot, exc)
            self._metrics.kv_saves.labels(instance, model, result).inc()
        self._trim(instance)
        self._export(instance)

    # -- a request's turn --------------------------------------------------------------------------

    async def prepare(self, instance: str, model: str, key: str, server: Server) -> int | None:
        """The slot to send this turn of conversation ``key`` to, its saved KV restored there
        first when it has some; None when the slots cannot be known (the engine then picks)."""
        book = self._books.setdefault((instance, model), _Book())
        for slot, held in book.holds.items():
            if held == key:
                book.holds.move_to_end(slot)
                return slot
        if book.count is None:
            book.count = await self._count(server)
        if not book.count:
            return None
        free = [s for s in range(book.count) if s not in book.holds]
        slot = free[0] if free else next(iter(book.holds))
        book.holds.pop(slot, None)
        saved = self.folder(instance) / _filename(model, key)
        if saved.exists():
            await self._restore(instance, model, slot, saved, server)
        book.holds[slot] = key
        return slot

    async def _restore(
        self, instance: str, model: str, slot: int, saved: Path, server: Server
    ) -> None:
        url, body = server.action(slot, "restore", saved.name)
        result = "ok"
        try:
            answer = await self._client.post(url, json=body, headers=server.headers,
                                             timeout=TIMEOUT)  # fmt: skip
            answer.raise_for_status()
            os.utime(saved)  # used: the last to go
        except (httpx.HTTPError, OSError) as exc:
            result = "failed"
            log.warning("%s/%s: restoring %s into slot %d failed: %s", instance, model,
                        saved.name, slot, exc)  # fmt: skip
        self._metrics.kv_restores.labels(instance, model, result).inc()

    async def _count(self, server: Server) -> int | None:
        url, params = server.slots()
        try:
            answer = await self._client.get(url, params=params, headers=server.headers,
                                            timeout=TIMEOUT)  # fmt: skip
            answer.raise_for_status()
            return len(answer.json())
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            log.warning("GET %s: %s; its slots are left to the engine", url, exc)
            return None

    # -- the files ---------------------------------------------------------------------------------

    def describe(self, instance: str) -> dict[str, int] | None:
        """``{"count", "bytes"}`` of the conversations saved for ``instance``."""
        if not self.keeps(instance):
            return None
        files = self._files(instance)
        return {"count": len(files), "bytes": sum(size for _, size, _ in files)}

    def _files(self, instance: str) -> list[tuple[Path, int, float]]:
        found = []
        for path in self.folder(instance).glob("*--*.bin"):
            try:
                stat = path.stat()
            except OSError:
                continue
            found.append((path, stat.st_size, stat.st_mtime))
        return found

    def _trim(self, instance: str) -> None:
        """Past the budget, the least recently used files go."""
        budget = self._configs[instance].budget
        files = sorted(self._files(instance), key=lambda f: f[2])
        total = sum(size for _, size, _ in files)
        for path, size, _ in files:
            if total <= budget:
                break
            path.unlink(missing_ok=True)
            total -= size
            log.info("%s: dropped the saved conversation %s (kv_keep budget)", instance, path.name)

    def _export(self, instance: str) -> None:
        described = self.describe(instance)
        if described is not None:
            self._metrics.kv_saved_bytes.labels(instance).set(described["bytes"])


def _filename(model: str, key: str) -> str:
    return f"{_UNSAFE.sub('_', model)}--{key}.bin"
