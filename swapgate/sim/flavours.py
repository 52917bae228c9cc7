"""The simulator's ``llama-swap``, ``ollama`` and ``openai`` flavours: the control endpoints
each of those backends has besides the OpenAI API (docs/compatibility.md). The ``vllm`` flavour,
with sleep mode, is vllm.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from swapgate.sim.backend import Backend, LoadFailed


async def ok(_: Request) -> Response:
    return PlainTextResponse("OK")


class PlainApi:
    """An OpenAI-compatible server and a health check."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def routes(self) -> list[Route]:
        return [Route("/health", ok)]


class LlamaSwapApi:
    """llama-swap's ``/running``, ``/upstream/MODEL/...`` and unloads."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.config = backend.config

    def routes(self) -> list[Route]:
        return [
            Route("/health", ok),
            Route("/running", self.running),
            Route("/upstream/{model}/health", self.upstream_health),
            Route("/api/models/unload/{model}", self.unload_one, methods=["POST"]),
            Route("/unload", self.unload_all),
        ]

    async def running(self, _: Request) -> JSONResponse:
        entries = [{"model": m, "state": s} for m, s in sorted(self.backend.resident.items())]
        return JSONResponse({"running": entries})

    async def upstream_health(self, request: Request) -> Response:
        model = request.path_params["model"]
        if model not in self.config.models:
            return PlainTextResponse("model not found", status_code=404)
        try:
            await self.backend.ensure_loaded(model)
        except LoadFailed as exc:
            return PlainTextResponse(str(exc), status_code=502)
        return PlainTextResponse("OK")

    async def unload_one(self, request: Request) -> Response:
        model = request.path_params["model"]
        if model not in self.config.models:
            return PlainTextResponse("model not found", status_code=404)
        self.backend.unload(model)
        return PlainTextResponse("OK")

    async def unload_all(self, _: Request) -> Response:
        for model in list(self.backend.resident):
            self.backend.unload(model)
        return PlainTextResponse("OK")


class OllamaApi:
    """Ollama's own API: version, what runs, what it has, and loads and unloads by generate."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.config = backend.config

    def routes(self) -> list[Route]:
        return [
            Route("/", self.ollama_root),
            Route("/api/version", self.ollama_version),
            Route("/api/ps", self.ollama_ps),
            Route("/api/tags", self.ollama_tags),
            Route("/api/generate", self.ollama_generate, methods=["POST"]),
        ]

    async def ollama_root(self, _: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def ollama_version(self, _: Request) -> JSONResponse:
        return JSONResponse({"version": "0.0.0-swapgate-sim"})

    async def ollama_ps(self, _: Request) -> JSONResponse:
        ready = [m for m, s in self.backend.resident.items() if s == "ready"]
        return JSONResponse({"models": [_ollama_model(m) for m in ready]})

    async def ollama_tags(self, _: Request) -> JSONResponse:
        return JSONResponse({"models": [_ollama_model(m) for m in self.config.models]})

    async def ollama_generate(self, request: Request) -> Response:
        body = await request.json()
        model = body.get("model")
        if model not in self.config.models:
            return JSONResponse({"error": f"model '{model}' not found"}, status_code=404)
        if body.get("keep_alive") in (0, "0", "0s"):
            self.backend.unload(model)
            reason = "unload"
        else:
            try:
                await self.backend.ensure_loaded(model)
            except LoadFailed as exc:
                return JSONResponse({"error": str(exc)}, status_code=500)
            reason = "load"
        now = datetime.now(UTC).isoformat()
        answer = {"model": model, "created_at": now, "response": "", "done": True}
        return JSONResponse({**answer, "done_reason": reason})


def _ollama_model(name: str) -> dict[str, Any]:
    return {"name": name, "model": name, "size": 1, "digest": "sim", "details": {}}
