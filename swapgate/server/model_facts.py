"""What ``/v1/models`` says of a model beyond its name (docs/configuration.md, "What /v1/models
says"): its ``context`` and ``capabilities``.

Two sources: the config (``capabilities``; ``context``, or the one its ``gguf`` gives), worked
out once per config; and its engine, asked once each time the model becomes warm on an
instance: llama-server's ``GET /props`` (the context a request gets, its modalities, its chat
template's tools), or an OpenAI server's ``GET /v1/models`` (vLLM's ``max_model_len``). What an
engine said is kept until the model loads again, and wins over the config: it is what runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from swapgate.config.settings import ModelConfig
from swapgate.drivers.base import Driver

log = logging.getLogger("swapgate.models")
ASK_TIMEOUT = httpx.Timeout(3.0)
# A /v1/models that started asking engines answers after this at most, with what came by then
ANSWER_WITHIN = 0.5
# Engines asked at once: the first listing after a fleet's loads asks each warm copy's engine
AT_ONCE = 16
# Kinds whose engine at a model's own address is one llama-server (``/props`` is its own)
_PROPS = frozenset({"process", "llama-swap", "llama-router"})
Copy = tuple[str, str, float]  # (instance, model, when it became warm there)


@dataclass(frozen=True, slots=True)
class Facts:
    context: int | None = None
    capabilities: frozenset[str] = frozenset()

    def over(self, other: Facts) -> Facts:
        """These facts, ``other``'s where these say nothing; capabilities of both."""
        context = self.context if self.context is not None else other.context
        return Facts(context, self.capabilities | other.capabilities)

    def fields(self) -> dict[str, Any]:
        """The keys of a ``/v1/models`` entry: only what is known."""
        known: dict[str, Any] = {}
        if self.context is not None:
            known["context"] = self.context
        if self.capabilities:
            known["capabilities"] = sorted(self.capabilities)
        return known


def declared(models: Mapping[str, ModelConfig], contexts: Mapping[str, int]) -> dict[str, Facts]:
    """Each model's facts as its config gives them (``contexts``: ``Catalog.contexts``)."""
    found = {}
    for name, conf in models.items():
        facts = Facts(contexts.get(name), frozenset(conf.capabilities))
        if facts != Facts():
            found[name] = facts
    return found


def from_props(props: Any) -> Facts:
    """llama-server's ``/props``: the context of a slot, images if it reads them, tools if
    its chat template takes them."""
    props = _object(props)
    context = _object(props.get("default_generation_settings")).get("n_ctx")
    if not _count(context):
        context = props.get("n_ctx")
    found = {"vision"} if _object(props.get("modalities")).get("vision") is True else set()
    if _object(props.get("chat_template_caps")).get("supports_tools") is True:
        found.add("tools")
    return Facts(context if _count(context) else None, frozenset(found))


def from_listing(listing: Any, model: str) -> Facts:
    """An OpenAI server's ``/v1/models`` entry for ``model``: vLLM's ``max_model_len``, or
    llama-server's ``meta.n_ctx``."""
    data = _object(listing).get("data")
    for entry in map(_object, data if isinstance(data, list) else []):
        if entry.get("id") == model:
            length = entry.get("max_model_len") or _object(entry.get("meta")).get("n_ctx")
            return Facts(length if _count(length) else None)
    return Facts()


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class EngineFacts:
    """What engines said of their warm models, asked once per load and kept."""

    def __init__(self) -> None:
        self._learned: dict[Copy, Facts] = {}
        self._asked: set[Copy] = set()
        self.version = 0  # changes with what was learned: a listing built before is stale
        self._asking: set[asyncio.Task[None]] = set()

    def models(self) -> set[str]:
        return {model for _, model, _ in self._learned}

    def of(self, model: str) -> Facts:
        """What the engines that have ``model`` warm said of it (the latest load first)."""
        found = Facts()
        for (_, name, _), facts in sorted(self._learned.items(), key=lambda kv: -kv[0][2]):
            if name == model:
                found = found.over(facts)
        return found

    async def learn(
        self, warm: Iterable[Copy], drivers: Mapping[str, Driver], upstream: dict[Copy, str]
    ) -> None:
        """Ask the engines of ``warm`` copies not asked yet; wait ``ANSWER_WITHIN`` at most
        (the asking goes on behind). ``upstream``: each copy's model name on its instance."""
        copies = [c for c in warm if c not in self._asked and c[0] in drivers]
        if not copies:
            return
        self._asked.update(copies)
        live = {key for key in self._learned if key[:2] in {c[:2] for c in copies}}
        for key in live:  # an earlier load's facts
            del self._learned[key]
            self.version += 1
        task = asyncio.create_task(self._ask_all(copies, drivers, upstream))
        self._asking.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._asking.discard)
        await asyncio.wait([task], timeout=ANSWER_WITHIN)

    async def _ask_all(
        self, copies: list[Copy], drivers: Mapping[str, Driver], upstream: dict[Copy, str]
    ) -> None:
        turns = asyncio.Semaphore(AT_ONCE)

        async def ask(copy: Copy) -> None:
            async with turns:
                await self._ask(client, copy, drivers[copy[0]], upstream[copy])

        async with httpx.AsyncClient(timeout=ASK_TIMEOUT) as client:
            await asyncio.gather(*(ask(c) for c in copies))

    async def _ask(self, client: httpx.AsyncClient, copy: Copy, driver: Driver, name: str) -> None:
        try:
            facts = await _ask_engine(client, driver, name)
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("%s/%s: its engine told no context (%s)", copy[0], copy[1], exc)
            return
        if facts != Facts():
            self._learned[copy] = facts
            self.version += 1


async def _ask_engine(client: httpx.AsyncClient, driver: Driver, name: str) -> Facts:
    """``/props`` where the model has a llama-server of its own; else ``/v1/models``."""
    headers = driver.headers
    if driver.kind in _PROPS:
        url, params = driver.url.rstrip("/"), {}
        if driver.kind == "process":
            url = driver.model_url(name) or url
        elif driver.kind == "llama-swap":
            url = f"{url}/upstream/{name}"
        else:
            params = {"model": name}
        answer = await client.get(f"{url}/props", params=params, headers=headers)
        answer.raise_for_status()
        return from_props(answer.json())
    answer = await client.get(f"{driver.url.rstrip('/')}/v1/models", headers=headers)
    answer.raise_for_status()
    return from_listing(answer.json(), name)
