"""Ollama's API around its proxied endpoints, and llama.cpp's router API (docs/compatibility.md,
"Ollama's API" and "llama.cpp router clients").

Ollama: ``GET /api/tags`` (the catalog), ``POST /api/show`` (what a model can do, its context),
``GET /api/ps`` (the warm copies, when each will be unloaded, its size), ``GET /api/version``,
``POST /api/pull`` (a configured model loaded now, with Ollama's progress lines), and the
prompt-less ``/api/generate`` or ``/api/chat`` that loads a model (or, with ``keep_alive: 0``,
unloads it): ``OllamaFront``. Models come from swapgate's config: ``create``, ``copy``,
``delete``, ``push`` and a pull of an unknown model are errors that say so. Errors are
Ollama's ``{"error": "..."}``.

llama.cpp's router: ``GET /models`` (the catalog with each model's ``status``),
``GET /props?model=`` (the engine's own ``/props`` for a warm model, the config's facts
otherwise), ``POST /models/load`` and ``/models/unload`` (the admin token where the admin API
is on; else open to the clients the model is open to).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from swapgate import __version__
from swapgate.control.loops.preload import PreloadResult
from swapgate.data.warm import WarmState
from swapgate.errors import BadRequest, ModelNotFound, SwapgateError
from swapgate.proxy.request import read_body
from swapgate.proxy.translate import ollama
from swapgate.server.routes.admin import unload_model
from swapgate.server.routes.public import Listing
from swapgate.server.runtime import Runtime

OLLAMA_VERSION = "0.12.6"  # the Ollama API this speaks: clients gate features on it
LOAD_PATHS = frozenset({"/api/generate", "/api/chat"})
PULL_EVERY = 1.0  # seconds between a pull's progress lines
FROM_CONFIG = (
    "swapgate serves the models in its config file; add or change them there (models: and "
    "each instance's models:) and reload (POST /admin/reload)"
)
_CAPABILITIES = {
    "vision": "vision",
    "tools": "tools",
    "embeddings": "embedding",
    "reasoning": "thinking",
}
PROPS_TIMEOUT = httpx.Timeout(5.0)
# The body these routes read, for the OpenAPI document (they parse it themselves, so that a bad
# one is answered in Ollama's shape)
NAMED: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {
                        "model": {"type": "string", "minLength": 1},
                        "stream": {"type": "boolean"},
                    },
                }
            }
        },
    }
}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _shaped(exc: SwapgateError) -> JSONResponse:
    response = _error(exc.status, exc.message)
    response.headers.update({k.decode(): v.decode() for k, v in exc.headers()})
    return response


class _Access:
    """What a caller may see and use: the models its key allows."""

    def __init__(self, runtime: Runtime, listing: Listing) -> None:
        self._runtime, self.listing = runtime, listing

    async def allowed(self, request: Request) -> list[dict[str, Any]]:
        auth, resolve = self._runtime.configured.auth, self._runtime.configured.catalog.resolve
        caller = auth.check(request.headers.raw)
        entries = await self.listing.entries()
        return [e for e in entries if auth.allows(caller, e["id"], resolve(e["id"]))]

    def model_of(self, request: Request, body: dict[str, Any]) -> str:
        """The configured model ``body`` names, which the caller's key may use."""
        name = body.get("model") or body.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("send the model's name in 'model'", param="model")
        runtime = self._runtime
        auth, catalog = runtime.configured.auth, runtime.configured.catalog
        model = catalog.known(name, runtime.registry.known_models())
        auth.check_model(auth.check(request.headers.raw), model)
        return model


def ollama_routes(runtime: Runtime, listing: Listing) -> APIRouter:
    router = APIRouter()
    access = _Access(runtime, listing)
    _catalog_routes(router, runtime, access)
    _pull_routes(router, runtime, access)
    _router_routes(router, runtime, access)
    return router


def _catalog_routes(router: APIRouter, runtime: Runtime, access: _Access) -> None:
    """What Ollama's clients read of the models: the list, one model, the loaded ones."""

    @router.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": OLLAMA_VERSION, "swapgate": __version__}

    @router.get("/api/tags")
    async def tags(request: Request) -> Response:
        try:
            entries = await access.allowed(request)
        except SwapgateError as exc:
            return _shaped(exc)
        return JSONResponse({"models": [_tag(runtime, e) for e in entries]})

    @router.post("/api/show", openapi_extra=NAMED)
    async def show(request: Request) -> Response:
        try:
            model = access.model_of(request, await _json(request))
            entries = {e["id"]: e for e in await access.listing.entries()}
        except SwapgateError as exc:
            return _shaped(exc)
        return JSONResponse(_shown(runtime, entries.get(model, {"id": model})))

    @router.get("/api/ps")
    async def ps(request: Request) -> Response:
        try:
            names = {e["id"] for e in await access.allowed(request)}
        except SwapgateError as exc:
            return _shaped(exc)
        return JSONResponse({"models": _running(runtime, names)})


def _pull_routes(router: APIRouter, runtime: Runtime, access: _Access) -> None:
    """A pull loads a configured model; what would change the models is refused."""

    @router.post("/api/pull", openapi_extra=NAMED)
    async def pull(request: Request) -> Response:
        try:
            body = await _json(request)
            model = access.model_of(request, body)
        except ModelNotFound as exc:
            return _error(404, f"{exc.message}. {FROM_CONFIG}")
        except SwapgateError as exc:
            return _shaped(exc)
        work = runtime.configured.preloader.preload(model)
        if body.get("stream") is False:
            result = await work
            if result.ok:
                return JSONResponse({"status": "success"})
            return _error(503, result.error or f"{model} did not load")
        lines = _pull_lines(runtime, model, asyncio.ensure_future(work))
        return StreamingResponse(lines, media_type="application/x-ndjson")

    async def refused(request: Request) -> Response:
        what = request.url.path.removeprefix("/api/")
        return _error(400, f"{what} is not available: {FROM_CONFIG}")

    for path, method in (
        ("/api/create", "POST"),
        ("/api/copy", "POST"),
        ("/api/delete", "DELETE"),
        ("/api/push", "POST"),
        ("/api/blobs/{digest}", "POST"),
    ):
        router.add_api_route(path, refused, methods=[method], include_in_schema=False)


def _router_routes(router: APIRouter, runtime: Runtime, access: _Access) -> None:
    """llama.cpp's router mode, as its clients read it."""

    @router.get("/models")
    async def models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": await access.allowed(request)}

    @router.get("/props")
    async def props(request: Request, model: str = Query(min_length=1)) -> dict[str, Any]:
        known = access.model_of(request, {"model": model})
        entries = {e["id"]: e for e in await access.listing.entries()}
        return await _props(runtime, known, entries.get(known, {}))

    def admin(request: Request) -> None:
        """The admin token where the admin API is on; else a client's key, as llama.cpp's
        router takes loads from its clients."""
        admin_auth = runtime.configured.admin_auth
        if admin_auth.on:
            admin_auth.check(request.headers.raw, request.url.path, write=True)

    @router.post("/models/load", openapi_extra=NAMED)
    async def load(request: Request) -> JSONResponse:
        admin(request)
        model = access.model_of(request, await _json(request))
        result = await runtime.configured.preloader.preload(model)
        if not result.ok:
            body = {"success": False, "error": {"message": result.error or "not loaded"}}
            return JSONResponse(body, status_code=503)
        return JSONResponse({"success": True, "model": model, "instances": list(result.instances)})

    @router.post("/models/unload", openapi_extra=NAMED)
    async def unload(request: Request) -> dict[str, Any]:
        admin(request)
        model = access.model_of(request, await _json(request))
        return {"success": True, "model": model, "instances": await unload_model(runtime, model)}


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise BadRequest("the body is not valid JSON; send a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _digest(model: str) -> str:
    """A stable stand-in for Ollama's digest: swapgate knows names, not the weights' hashes."""
    return hashlib.sha256(model.encode()).hexdigest()


def _details(runtime: Runtime, model: str) -> dict[str, Any]:
    conf = runtime.configured.settings.model_settings(model)
    return {
        "parent_model": "",
        "format": "gguf" if getattr(conf, "gguf", None) else "",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _size(runtime: Runtime, model: str) -> int:
    """Its bytes where known: the config's ``memory``, else what was measured."""
    conf = runtime.configured.settings.model_settings(model)
    memory = getattr(conf, "memory", None)
    if isinstance(memory, int):
        return memory
    for view in runtime.registry.snapshot().instances:
        if view.sizes.get(model):
            return view.sizes[model]
    return 0


def _tag(runtime: Runtime, entry: dict[str, Any]) -> dict[str, Any]:
    name = entry["id"]
    model = entry.get("swapgate", {}).get("alias_of", name)
    return {
        "name": name,
        "model": name,
        "modified_at": ollama.now_text(),
        "size": _size(runtime, model),
        "digest": _digest(name),
        "details": _details(runtime, model),
    }


def _shown(runtime: Runtime, entry: dict[str, Any]) -> dict[str, Any]:
    name = entry["id"]
    model = entry.get("swapgate", {}).get("alias_of", name)
    engine_has = set(entry.get("capabilities", []))
    capabilities = ["embedding"] if engine_has == {"embeddings"} else ["completion"]
    capabilities += [_CAPABILITIES[c] for c in sorted(engine_has) if c != "embeddings"]
    info: dict[str, Any] = {"general.architecture": "swapgate", "general.name": name}
    if entry.get("context"):
        info["swapgate.context_length"] = entry["context"]
    return {
        "modelfile": f"# served by swapgate: {FROM_CONFIG}\nFROM {name}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": _details(runtime, model),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": ollama.now_text(),
    }


def _running(runtime: Runtime, names: set[str]) -> list[dict[str, Any]]:
    """Each warm copy of a model the caller may see: where, until when, how large."""
    snap = runtime.registry.snapshot()
    wall = time.time() - snap.now  # the registry's clock to the wall's
    running = []
    for view in snap.instances:
        for model, held in view.models.items():
            if held.state is not WarmState.WARM or model not in names:
                continue
            deadline = runtime.idle.deadline(view.name, model)
            expires = _rfc3339(wall + deadline) if deadline is not None else "2318-11-01T00:00:00Z"
            size = _size(runtime, model)
            running.append(
                {
                    "name": model,
                    "model": model,
                    "size": size,
                    "digest": _digest(model),
                    "details": _details(runtime, model),
                    "expires_at": expires,
                    "size_vram": view.sizes.get(model, size),
                    "swapgate": {"instance": view.name},
                }
            )
    return running


def _rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


async def _pull_lines(
    runtime: Runtime, model: str, work: asyncio.Future[PreloadResult]
) -> AsyncIterator[bytes]:
    """Ollama's pull progress from the real load: what runs where, how far, then ``success``
    (or the load's error as the last line)."""
    yield _line({"status": "pulling manifest"})
    shown = ""
    while not work.done():
        text = _loading(runtime, model)
        if text != shown:
            shown = text
            yield _line({"status": text, "digest": _digest(model)})
        await asyncio.wait([work], timeout=PULL_EVERY)
    result = work.result()
    if not result.ok:
        yield _line({"error": result.error or f"{model} did not load"})
        return
    yield _line({"status": f"{model} is warm on {', '.join(result.instances)}"})
    yield _line({"status": "success"})


def _loading(runtime: Runtime, model: str) -> str:
    for view in runtime.registry.snapshot().instances:
        if view.state_of(model) is WarmState.LOADING:
            figure = runtime.coordinator.progress.figure(view.name, model)
            shown = f": {figure.text}" if figure is not None else ""
            return f"loading {model} on {view.name}{shown}"
    return f"placing {model}"


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def _props(runtime: Runtime, model: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A warm copy's engine's own ``/props`` where it has one; else the config's facts."""
    snap = runtime.registry.snapshot()
    catalog = runtime.configured.catalog
    for view in snap.instances:
        if view.state_of(model) is not WarmState.WARM:
            continue
        driver = runtime.drivers.get(view.name)
        if driver is None:
            continue
        upstream = catalog.upstream_name(view.name, model)
        server = runtime.kv.server(view.name, driver.model_url(upstream) or driver.url, upstream)
        url, params = server.get("/props")
        try:
            answer = await runtime.control_client.get(
                url, params=params, headers=driver.headers, timeout=PROPS_TIMEOUT
            )
            if answer.status_code == 200 and isinstance(answer.json(), dict):
                return {**answer.json(), "model_alias": model}
        except (httpx.HTTPError, ValueError):
            continue
    settings: dict[str, Any] = {"n_ctx": entry["context"]} if entry.get("context") else {}
    capabilities = set(entry.get("capabilities", []))
    return {
        "model_alias": model,
        "model_path": None,
        "default_generation_settings": settings,
        "modalities": {"vision": "vision" in capabilities, "audio": False},
        "swapgate": {"status": entry.get("status", {}).get("value", "unloaded")},
    }


class OllamaFront:
    """``/api/generate`` and ``/api/chat`` with nothing to answer (no prompt, no messages):
    Ollama's way to load a model, or with ``keep_alive: 0`` to unload it; any other body goes
    on to the proxied endpoint as it came."""

    def __init__(
        self, runtime: Runtime, endpoint: Callable[[Scope, Receive, Send], Awaitable[None]]
    ) -> None:
        self._runtime = runtime
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self._runtime.configured.settings.server.max_body_bytes
        try:
            body = await read_body(receive, limit)
        except SwapgateError as exc:
            await _send(send, _shaped(exc))
            return
        payload = _parsed(body)
        if payload is None or not _empty(scope["path"], payload):
            await self._endpoint(scope, _replay(body, receive), send)
            return
        await _send(send, await self._load(scope, payload))

    async def _load(self, scope: Scope, payload: dict[str, Any]) -> Response:
        runtime = self._runtime
        auth, catalog = runtime.configured.auth, runtime.configured.catalog
        generate = scope["path"] == "/api/generate"
        try:
            name = payload.get("model")
            if not isinstance(name, str) or not name:
                raise BadRequest("send the model's name in 'model'", param="model")
            model = catalog.known(name, runtime.registry.known_models())
            auth.check_model(auth.check(scope["headers"]), model)
            unload = payload.get("keep_alive") in (0, "0", "0s", "0m")
            if unload:
                await unload_model(runtime, model)
            else:
                result = await runtime.configured.preloader.preload(model)
                if not result.ok:
                    return _error(503, result.error or f"{model} did not load")
        except SwapgateError as exc:
            return _shaped(exc)
        answer: dict[str, Any] = {"model": name, "created_at": ollama.now_text()}
        if generate:
            answer["response"] = ""
        else:
            answer["message"] = {"role": "assistant", "content": ""}
        return JSONResponse({**answer, "done": True, "done_reason": "unload" if unload else "load"})


def _parsed(body: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except ValueError:
        return None  # the endpoint says what is wrong with it
    return payload if isinstance(payload, dict) else None


def _empty(path: str, payload: dict[str, Any]) -> bool:
    if path == "/api/generate":
        return not payload.get("prompt") and not payload.get("images")
    return payload.get("messages") in (None, [])


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` read again first."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _send(send: Send, response: Response) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response.raw_headers,
        }
    )
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
