"""Which slot holds which conversation (docs/kv-keep.md): a ``SlotBook`` per model as loaded
now, its slot count and the engine's identity asked of the engine once per load. Where replicas
share their books on Redis (swapgate/cluster/kv_slots.py), claims, ends and what the slots hold
go there, and this replica's own book stands in when Redis does not answer. The keeper
(keeper.py) saves and restores what these books say the slots hold.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from swapgate.control.memory.kv.book import NO_SLOT, Claim, SharedBook, SlotBook

log = logging.getLogger("swapgate.kv")
TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a save waits for its slot's running answer


@dataclass(frozen=True, slots=True)
class Server:
    """Where a model's slots are: its own server (``process``; ``llama-swap`` forwards
    ``/upstream/MODEL/...`` to it), or a router's, which takes the model by name (a ``model``
    query to GET, a ``model`` field to POST)."""

    url: str
    model: str
    routed: bool
    headers: dict[str, str] = field(default_factory=dict)

    def get(self, path: str) -> tuple[str, dict[str, str]]:
        return f"{self.url}{path}", ({"model": self.model} if self.routed else {})

    def action(self, slot: int, action: str, filename: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"filename": filename}
        if self.routed:
            body["model"] = self.model
        return f"{self.url}/slots/{slot}?action={action}", body


class Slots:
    def __init__(
        self,
        client: httpx.AsyncClient,
        clock: Callable[[], float] = time.monotonic,
        shared: SharedBook | None = None,
    ) -> None:
        """``shared``: the slot books replicas on Redis share (swapgate/cluster/kv_slots.py)."""
        self._client = client
        self._clock = clock
        self._shared = shared
        self._commands: Mapping[tuple[str, str], str] = {}
        self._books: dict[tuple[str, str], SlotBook] = {}
        self._asking: dict[tuple[str, str], asyncio.Lock] = {}

    def configure(self, commands: Mapping[tuple[str, str], str]) -> None:
        """``commands``: each (instance, model)'s start command, part of its identity."""
        self._commands = commands

    async def loaded(self, instance: str, model: str, kept: bool) -> None:
        """``model`` was (re)started on ``instance``: its slots are empty (``kept``: a
        ``kv_keep`` instance, whose shared book is cleared too)."""
        self._books.pop((instance, model), None)
        if self._shared is not None and kept:
            await self._shared.clear(instance, model)

    def leaving(self, instance: str, model: str) -> SlotBook | None:
        """``model`` leaves ``instance``: its book, for the save, and none from now on."""
        return self._books.pop((instance, model), None)

    async def finish(self, claim: Claim) -> None:
        """The turn sent to ``claim``'s slot ended."""
        if claim.shared and self._shared is not None:
            await self._shared.finish(*claim.book.where, claim.slot, claim.key)
        else:
            claim.book.finish(claim)

    async def claim(self, instance: str, model: str, book: SlotBook, key: str) -> Claim | None:
        """A slot of ``book``'s, in the book the replicas share where there is one."""
        if self._shared is not None:
            got = await self._shared.claim(instance, model, book.count, key)
            if got == NO_SLOT:
                return None
            if got is not None:
                return Claim(book, got[0], key, new=got[1], shared=True)
        return book.claim(key)  # alone, or Redis does not answer

    async def held(self, instance: str, model: str, book: SlotBook) -> list[tuple[int, str]]:
        """The conversations ``model``'s slots hold, most recently finished first: of every
        replica where they share a book."""
        if self._shared is not None:
            held = await self._shared.held(instance, model)
            await self._shared.clear(instance, model)
            if held is not None:
                return held
        return book.held()

    async def book(self, instance: str, model: str, server: Server) -> SlotBook | None:
        """The slots of ``model`` as loaded now: asked of its engine once per load."""
        where = (instance, model)
        book = self._books.get(where)
        if book is not None:
            return book if book.count else None
        async with self._asking.setdefault(where, asyncio.Lock()):
            book = self._books.get(where)
            if book is None:
                count = await self._count(server)
                identity = await self._identity(instance, model, server) if count else None
                book = self._books[where] = SlotBook(count or 0, self._clock, identity, where)
        return book if book.count else None

    async def _count(self, server: Server) -> int | None:
        url, params = server.get("/slots")
        try:
            answer = await self._client.get(
                url, params=params, headers=server.headers, timeout=TIMEOUT
            )
            answer.raise_for_status()
            return len(answer.json())
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            log.warning("GET %s: %s; its slots are left to the engine", url, exc)
            return None

    async def _identity(self, instance: str, model: str, server: Server) -> str | None:
        """Which model the engine runs, as its ``GET /props`` says (the weights' path, the
        context size) and the command swapgate started it with: a saved file is restored
        only into the same."""
        url, params = server.get("/props")
        try:
            answer = await self._client.get(
                url, params=params, headers=server.headers, timeout=TIMEOUT
            )
            answer.raise_for_status()
            props = answer.json()
            settings = props.get("default_generation_settings") or {}
            what = [props.get("model_path"), props.get("n_ctx") or settings.get("n_ctx")]
        except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:
            log.warning(
                "GET %s: %s; no conversation is saved or restored for %s/%s",
                url,
                exc,
                instance,
                model,
            )
            return None
        what.append(self._commands.get((instance, model)))
        return hashlib.sha256(json.dumps(what, default=str).encode()).hexdigest()[:16]
