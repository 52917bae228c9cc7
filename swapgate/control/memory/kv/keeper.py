"""Conversations that survive swaps (docs/kv-keep.md): on a ``kv_keep`` instance running
llama.cpp's llama-server (``kind: process``, ``llama-router`` or ``llama-swap``), each slot's KV
cache is saved to a file before its model is unloaded, keyed by the conversation it holds, and
restored into a slot when a turn of that conversation comes back; the turn is sent to that slot
(``id_slot``), so the engine reads only its new tokens.

swapgate hands out the slots itself (``Slots``, slots.py, over the books of book.py). A saved
file is restored only into the engine that made it (files.py), and only for the client key that
made it, unless ``share_across_keys``. A save or a restore that fails is logged and counted, never
the request's failure: the turn is then served by reading its whole prompt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from swapgate.config.settings import InstanceConfig, KvKeepConfig
from swapgate.control.memory.kv.book import Claim, SharedBook
from swapgate.control.memory.kv.files import Found, SavedFiles
from swapgate.control.memory.kv.slots import TIMEOUT, Server, Slots
from swapgate.metrics import Metrics
from swapgate.policy.conversation import scoped

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from opentelemetry.trace import Span

    from swapgate.tracing.spans import Attribute, Tracing

log = logging.getLogger("swapgate.kv")
NO_SAVE_PATH = 501  # llama-server started without --slot-save-path


class KvKeeper:
    def __init__(
        self,
        client: httpx.AsyncClient,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedBook | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``shared``: the slot books replicas on Redis share (swapgate/cluster/kv_slots.py);
        ``tracing``: each save and restore a span (swapgate/tracing/)."""
        self._tracing = tracing
        self._client = client
        self._metrics = metrics
        self.slots = Slots(client, clock, shared)
        self._configs: dict[str, KvKeepConfig] = {}
        self._kinds: dict[str, str] = {}
        self._files: dict[str, SavedFiles] = {}
        self._warned: set[tuple[str, str]] = set()

    def configure(self, instances: list[InstanceConfig]) -> None:
        self._configs = {i.name: i.kv_keep for i in instances if i.kv_keep is not None}
        self._kinds = {i.name: i.kind for i in instances}
        self._files = {
            i.name: SavedFiles(i.kv_folder, i.kv_keep.budget)
            for i in instances
            if i.kv_keep is not None and i.kv_folder is not None
        }
        self.slots.configure(
            {(i.name, m): command.cmd for i in instances for m, command in i.commands.items()}
        )
        for name, files in self._files.items():
            files.create()
            self._export(name)

    def keeps(self, instance: str) -> bool:
        return instance in self._configs

    def server(
        self, instance: str, url: str, model: str, headers: dict[str, str] | None = None
    ) -> Server:
        """``model``'s slots on ``instance``: at ``url``, its own server, its router's, or
        its llama-swap's (``model``: its name there)."""
        kind = self._kinds.get(instance)
        if kind == "llama-swap":
            url = f"{url.rstrip('/')}/upstream/{model}"
        return Server(url, model, kind == "llama-router", dict(headers or {}))

    def folder(self, instance: str) -> Path:
        """Where ``instance``'s conversations are saved (its llama-server's --slot-save-path)."""
        return self._files[instance].folder

    # -- around a model's load and unload --------------------------------------------------------

    async def loaded(self, instance: str, model: str) -> None:
        """``model`` was (re)started on ``instance``: its slots are empty."""
        await self.slots.loaded(instance, model, self.keeps(instance))

    async def save(self, instance: str, model: str, server: Server) -> None:
        """Before ``model`` leaves ``instance``: save the slots that hold a conversation, the
        most recently used first, until ``budget`` is written or ``save_timeout`` is spent."""
        book = self.slots.leaving(instance, model)
        if book is None or not self.keeps(instance):
            return
        held = await self.slots.held(instance, model, book)
        if not held:
            return
        if book.identity is None:
            log.warning(
                "%s/%s: its engine's GET /props did not answer; its conversations are "
                "not saved (a file must name the model that made it)",
                instance,
                model,
            )
            return
        files, timeout = self._files[instance], self._configs[instance].save_timeout
        written, saved = 0, []
        try:
            async with asyncio.timeout(timeout):
                for slot, key in held:
                    if written >= files.budget:
                        break  # older conversations would only push newer ones out
                    size = await self._save(instance, model, slot, key, book.identity, server)
                    written += size
                    saved += [key] if size else []
        except TimeoutError:
            self._metrics.kv_saves.labels(instance, model, "timeout").inc()
            log.warning(
                "%s/%s: saving its conversations stopped after kv_keep.save_timeout "
                "(%gs); the rest are read again when they come back",
                instance,
                model,
                timeout,
            )
        files.rank(model, saved)
        files.trim()
        self._export(instance)

    async def _save(
        self, instance: str, model: str, slot: int, key: str, identity: str, server: Server
    ) -> int:
        files = self._files[instance]
        url, body = server.action(slot, "save", files.name(model, key))
        result, size = "ok", 0
        span = _span(self._tracing, "save", instance, model, slot)
        try:
            answer = await self._client.post(
                url, json=body, headers=server.headers, timeout=TIMEOUT
            )
            if answer.status_code == NO_SAVE_PATH:
                result = "unsupported"
                self._no_save_path(instance, model, answer.text)
            else:
                answer.raise_for_status()
                made = files.made(model, key, identity)
                if made is None:
                    result = "missing"
                    self._saved_elsewhere(instance, model, files.name(model, key))
                size = made or 0
        except (httpx.HTTPError, OSError) as exc:
            result = "failed"
            log.warning("%s/%s: saving slot %d failed: %s", instance, model, slot, exc)
        self._metrics.kv_saves.labels(instance, model, result).inc()
        _spanned(self._tracing, span, result, size)
        return size

    def _no_save_path(self, instance: str, model: str, detail: str) -> None:
        if (instance, model) in self._warned:
            return
        self._warned.add((instance, model))
        log.warning(
            "%s/%s: its llama-server saves no slots (%s); start it with --slot-save-path "
            "%s for kv_keep",
            instance,
            model,
            detail[:200],
            self.folder(instance),
        )

    def _saved_elsewhere(self, instance: str, model: str, name: str) -> None:
        """The engine said it saved a slot, and the file is not where swapgate looks: its
        --slot-save-path is another folder (or the same one seen through a container mount
        under another path), so no conversation of it would ever be restored."""
        if (instance, model) in self._warned:
            return
        self._warned.add((instance, model))
        log.error(
            "%s/%s: its llama-server saved %s, but not into %s, where swapgate looks: "
            "nothing saved will be restored. Make kv_keep.dir the folder its command's "
            "--slot-save-path names, as swapgate's host sees it",
            instance,
            model,
            name,
            self.folder(instance),
        )

    # -- a request's turn --------------------------------------------------------------------------

    async def prepare(
        self, instance: str, model: str, key: str, tenant: str | None, server: Server
    ) -> Claim | None:
        """The slot to send this turn of conversation ``key`` (of client key ``tenant``) to, its
        saved KV restored there first when it has some; None when the engine picks (its slots
        unknown, its own slot busy with another turn, or none idle). Give it back with
        ``finish``."""
        book = await self.slots.book(instance, model, server)
        if book is None:
            return None
        if not self._configs[instance].share_across_keys:
            key = scoped(key, tenant)
        claim = await self.slots.claim(instance, model, book, key)
        if claim is None or not claim.new or book.identity is None:
            return claim
        found = self._files[instance].find(model, key, book.identity)
        if found is Found.STALE:
            self._metrics.kv_restores.labels(instance, model, "stale").inc()
        elif found is Found.SAVED:
            await self._restore(instance, model, claim, server)
        return claim

    async def finish(self, claim: Claim) -> None:
        """The turn sent to ``claim``'s slot ended."""
        await self.slots.finish(claim)

    async def _restore(self, instance: str, model: str, claim: Claim, server: Server) -> None:
        files = self._files[instance]
        url, body = server.action(claim.slot, "restore", files.name(model, claim.key))
        result = "ok"
        span = _span(self._tracing, "restore", instance, model, claim.slot)
        try:
            answer = await self._client.post(
                url, json=body, headers=server.headers, timeout=TIMEOUT
            )
            answer.raise_for_status()
            files.used(model, claim.key)
        except httpx.HTTPError as exc:
            result = "failed"
            log.warning(
                "%s/%s: restoring %s into slot %d failed: %s",
                instance,
                model,
                body["filename"],
                claim.slot,
                exc,
            )
        self._metrics.kv_restores.labels(instance, model, result).inc()
        _spanned(self._tracing, span, result)

    # -- the files ---------------------------------------------------------------------------------

    def describe(self, instance: str) -> dict[str, int] | None:
        """``{"count", "bytes"}`` of the conversations saved for ``instance``."""
        if not self.keeps(instance):
            return None
        files = self._files[instance].listing()
        return {"count": len(files), "bytes": sum(saved.size for saved in files)}

    def _export(self, instance: str) -> None:
        described = self.describe(instance)
        if described is not None:
            self._metrics.kv_saved_bytes.labels(instance).set(described["bytes"])


def _span(
    tracing: Tracing | None, action: str, instance: str, model: str, slot: int
) -> Span | None:
    """A save's or a restore's span, under the swap or the request it is part of."""
    if tracing is None:
        return None
    attributes: dict[str, Attribute] = {
        "swapgate.instance": instance,
        "swapgate.model": model,
        "swapgate.slot": slot,
    }
    return tracing.span(f"kv {action} {model}", attributes)


def _spanned(tracing: Tracing | None, span: Span | None, result: str, size: int = 0) -> None:
    if span is not None and tracing is not None:
        error = "" if result == "ok" else result
        tracing.finish(span, {"swapgate.result": result, "swapgate.bytes": size}, error)
