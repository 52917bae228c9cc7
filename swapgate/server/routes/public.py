"""``GET /`` (what this is), ``/v1/models``, ``/healthz``, ``/readyz`` and the metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from swapgate import __version__
from swapgate.control.state.registry import Registry
from swapgate.data.warm import WarmState
from swapgate.server.runtime import Runtime


def public_routes(runtime: Runtime) -> APIRouter:
    router = APIRouter()

    # Claude Code sends HEAD / before its first request: a 404 there reads as a wrong base URL.
    @router.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict[str, Any]:
        metrics = runtime.configured.settings.metrics
        return {
            "name": "swapgate",
            "version": __version__,
            "what": "a model-swapping gateway: one OpenAI-compatible API in front of many "
            "inference servers",
            "api": "/v1 (chat/completions, completions, embeddings, responses, messages, "
            "models, ...)",
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
        listing = model_listing(runtime)
        allowed = [e for e in listing if auth.allows(caller, e["id"], resolve(e["id"]))]
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


def model_listing(runtime: Runtime) -> list[dict[str, Any]]:
    """Every servable model, alias and selector, with its status as llama.cpp's router writes
    it (its warmest copy; a selector's warmest target) and where swapgate sees it warm or
    loading."""
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
        warmest = status({state for t in targets for state in states.get(t, {}).values()})
        entries.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "swapgate",
                "status": {"value": warmest},
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
