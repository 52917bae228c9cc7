"""``GET /`` (what this is), ``/v1/models``, ``/healthz``, ``/readyz`` and the metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from swapgate import __version__
from swapgate.control.state.registry import Registry
from swapgate.data.warm import WarmState
from swapgate.server.model_facts import EngineFacts, Facts, declared
from swapgate.server.runtime import Runtime


class Listing:
    """Every model as ``/v1/models`` lists it, with what engines said of their warm copies;
    shared by the routes that list models (``/v1/models``, ``/models``, Ollama's)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.engine_facts = EngineFacts()  # what engines said of their warm models
        self._facts = _Listed()

    async def entries(self) -> list[dict[str, Any]]:
        runtime = self._runtime
        await _learn(runtime, self.engine_facts)
        return model_listing(runtime, self._facts.of(runtime, self.engine_facts))


def public_routes(runtime: Runtime, listing: Listing) -> APIRouter:
    router = APIRouter()

    # Claude Code sends HEAD / before its first request: a 404 there reads as a wrong base URL.
    # HEAD is left out of the OpenAPI document, where it would repeat GET's operation id.
    @router.head("/", include_in_schema=False)
    @router.get("/")
    async def root() -> dict[str, Any]:
        metrics = runtime.configured.settings.metrics
        return {
            "name": "swapgate",
            "version": __version__,
            "what": "a model-swapping gateway: one OpenAI-compatible API in front of many "
            "inference servers",
            "api": "/v1 (chat/completions, completions, embeddings, responses, messages, "
            "models, ...); Ollama's /api (chat, generate, embed, tags, show, ps, pull); "
            "llama.cpp's router /models and /props",
            "health": {"alive": "/healthz", "ready": "/readyz"},
            "metrics": metrics.path if metrics.enabled else None,
            "admin": "/admin (with the admin token)",
            "docs": "README.md and docs/ in the swapgate source",
        }

    @router.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        """The models the caller's key may use (docs/keys.md)."""
        auth, resolve = runtime.configured.auth, runtime.configured.catalog.resolve
        caller = auth.check(request.headers.raw)
        entries = await listing.entries()
        allowed = [e for e in entries if auth.allows(caller, e["id"], resolve(e["id"]))]
        return {"object": "list", "data": allowed}

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz() -> JSONResponse:
        up = runtime.registry.up_names()
        ready = runtime.started and bool(up)
        body = {"status": "ready" if ready else "not ready", "instances_up": up}
        return JSONResponse(body, status_code=200 if ready else 503)

    if runtime.configured.settings.metrics.enabled:

        @router.get(runtime.configured.settings.metrics.path, include_in_schema=False)
        async def metrics() -> Response:
            payload = runtime.metrics.exposition()
            return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return router


# llama.cpp's router's words for a model's state (Open WebUI reads them), warmest first
_STATUS = (
    (WarmState.WARM, "loaded"),
    (WarmState.LOADING, "loading"),
    (WarmState.ASLEEP, "sleeping"),
)


def status(states: set[WarmState]) -> str:
    """What ``/v1/models`` says of a model whose copies are in ``states``: its warmest."""
    return next((word for state, word in _STATUS if state in states), "unloaded")


def model_listing(
    runtime: Runtime, facts: Mapping[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every servable model, alias and selector, with its status as llama.cpp's router writes
    it (its warmest copy; a selector's warmest target), where swapgate sees it warm or
    loading, and its ``facts`` (context, capabilities) where known."""
    facts = facts or {}
    registry = runtime.registry
    states = _copies(registry)
    created = int(time.time())
    entries = []
    aliases = runtime.configured.catalog.aliases
    selectors = runtime.configured.catalog.selectors
    for name in sorted(registry.known_models() | aliases.keys()):
        model = aliases.get(name, name)
        held = states.get(model, {})
        extra: dict[str, Any] = {
            "warm_on": [i for i, state in held.items() if state is WarmState.WARM],
            "loading_on": [i for i, state in held.items() if state is WarmState.LOADING],
            "served_by": registry.instances_of(model),
        }
        if model != name:
            extra["alias_of"] = model
        choose = selectors.get(model)
        if choose is not None:  # a selector: it answers from one of these
            extra["choose"] = {"from": list(choose.targets), "strategy": choose.strategy}
        targets = choose.targets if choose else [model]
        warmest: dict[str, Any] = {
            "value": status({state for t in targets for state in states.get(t, {}).values()})
        }
        failing = registry.failing.of(model)
        if failing is not None and warmest["value"] != "loaded":
            warmest = {"value": "failing", "reason": failing.error}
        entries.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "swapgate",
                "status": warmest,
                **facts.get(model, {}),
                "swapgate": extra,
            }
        )
    return entries


def _copies(registry: Registry) -> dict[str, dict[str, WarmState]]:
    """Each model's copies that are not cold, by instance in the config's order: read from
    the registry's index, not from a view of every instance (docs/architecture.md)."""
    held = registry.copies.every()
    snap = registry.snapshot({name: None for names in held.values() for name in names})
    return {
        model: {name: snap.instance(name).state_of(model) for name in names}
        for model, names in held.items()
    }


class _Listed:
    """Each model's facts as ``/v1/models`` adds them, worked out once per config (declared)
    and again only when an engine said something new."""

    def __init__(self) -> None:
        self._settings: object = None
        self._declared: dict[str, Facts] = {}
        self._fields: dict[str, dict[str, Any]] = {}
        self._learned = -1  # the engines' version the fields were built at

    def of(self, runtime: Runtime, engines: EngineFacts) -> dict[str, dict[str, Any]]:
        settings = runtime.configured.settings
        if settings is not self._settings:
            contexts = runtime.configured.catalog.contexts
            self._declared = declared(settings.models, contexts)
            self._settings, self._learned = settings, -1
        if engines.version != self._learned:
            self._learned = engines.version
            names = self._declared.keys() | engines.models()
            known = {m: engines.of(m).over(self._declared.get(m, Facts())) for m in names}
            self._fields = {m: f.fields() for m, f in known.items() if f.fields()}
        return self._fields


async def _learn(runtime: Runtime, engines: EngineFacts) -> None:
    """Ask the engines of copies that became warm since they were last asked."""
    registry, catalog = runtime.registry, runtime.configured.catalog
    warm = {}
    for model, instances in registry.copies.every().items():
        for instance in instances:
            since = registry.warm_since(instance, model)
            if since is not None:
                warm[(instance, model, since)] = catalog.upstream_name(instance, model)
    await engines.learn(warm, runtime.drivers, warm)
