"""The simulator's HTTP face: the llama-swap, Ollama or OpenAI flavour, plus ``/sim/*``.

Like the real servers, a request for a cold model gets no header until the load is done.
``GET /sim/stats`` counts loads, unloads, completed and cancelled generations for tests and
rehearsals; ``POST /sim/faults`` changes the fault rates and load time of a running simulator.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import swapgate.sim.completions as completions
from swapgate.sim.backend import Backend, LoadFailed, SimConfig

T = TypeVar("T")
FAULTS = (
    "fail_load_rate",
    "crash_mid_stream_rate",
    "hang_rate",
    "load_time",
    "ttft",
    "prefill",
    "token_rate",
)


class ClientGone(Exception):
    pass


def create_sim_app(config: SimConfig) -> Starlette:
    return Starlette(routes=SimServer(config).routes())


class SimServer:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.backend = Backend(config)

    def routes(self) -> list[Route]:
        routes = [
            Route("/sim/stats", self.stats),
            Route("/sim/faults", self.faults, methods=["POST"]),
            Route("/sim/last-response", self.last_response),
            Route("/v1/models", self.list_models),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.complete, methods=["POST"]),
            Route("/v1/embeddings", self.embed, methods=["POST"]),
        ]
        flavour = {
            "llama-swap": [
                Route("/health", self.ok),
                Route("/running", self.running),
                Route("/upstream/{model}/health", self.upstream_health),
                Route("/api/models/unload/{model}", self.unload_one, methods=["POST"]),
                Route("/unload", self.unload_all),
            ],
            "ollama": [
                Route("/", self.ollama_root),
                Route("/api/version", self.ollama_version),
                Route("/api/ps", self.ollama_ps),
                Route("/api/tags", self.ollama_tags),
                Route("/api/generate", self.ollama_generate, methods=["POST"]),
            ],
            "openai": [Route("/health", self.ok)],
        }
        return routes + flavour[self.config.flavor]

    # -- /sim ----------------------------------------------------------------------------------

    async def stats(self, _: Request) -> JSONResponse:
        return JSONResponse(self.backend.stats())

    async def last_response(self, _: Request) -> Response:
        """The exact bytes of the last non-streamed answer, to check a proxy changed nothing."""
        return Response(self.backend.last_body, media_type="application/octet-stream")

    async def faults(self, request: Request) -> JSONResponse:
        changes = await request.json()
        for key in FAULTS:
            if key in changes:
                setattr(self.config, key, float(changes[key]))
        return JSONResponse({key: getattr(self.config, key) for key in FAULTS})

    # -- OpenAI API ----------------------------------------------------------------------------

    async def list_models(self, _: Request) -> JSONResponse:
        data = [{"id": m, "object": "model", "owned_by": "sim"} for m in self.config.models]
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def complete(self, request: Request) -> Response:
        return await self._generate(request, "text")

    async def embed(self, request: Request) -> Response:
        return await self._generate(request, "embedding")

    async def _generate(self, request: Request, kind: str) -> Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            model = body["model"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "invalid_request_error", "send a JSON object with a 'model'")
        if model not in self.config.models:
            return _error(404, "model_not_found", f"model {model!r} not found")
        counters = self.backend.counters
        counters["requests"] += 1
        if self.config.grow_rss:
            self.backend.leaked.append(b"\x01" * self.config.grow_rss)  # written: resident
        try:
            return await _unless_disconnected(request, self._answer(kind, model, body))
        except ClientGone:
            counters["cancelled"] += 1
            return Response(status_code=499)
        except LoadFailed as exc:
            return _error(502, "load_failed", str(exc))

    async def _answer(self, kind: str, model: str, body: dict[str, Any]) -> Response:
        await self.backend.ensure_loaded(model)
        if self.backend.roll(self.config.hang_rate):
            self.backend.counters["hung"] += 1
            await asyncio.Event().wait()
        await asyncio.sleep(self.config.ttft)
        if kind == "embedding":
            return self._json_answer(completions.embeddings(model, body))
        words = completions.tokens(model, completions.max_tokens(body, self.config.max_tokens))
        if body.get("stream") is True:
            return StreamingResponse(
                self._stream(kind, model, words), media_type="text/event-stream"
            )
        await asyncio.sleep(len(words) / self.config.token_rate)
        return self._json_answer(completions.completion(kind, model, "".join(words), len(words)))

    def _json_answer(self, answer: dict[str, Any]) -> Response:
        self.backend.counters["completed"] += 1
        self.backend.last_body = json.dumps(answer).encode()
        return Response(self.backend.last_body, media_type="application/json")

    async def _stream(self, kind: str, model: str, words: list[str]) -> AsyncIterator[bytes]:
        counters = self.backend.counters
        crash_at = len(words) // 2 if self.backend.roll(self.config.crash_mid_stream_rate) else None
        counters["active"] += 1
        try:
            await asyncio.sleep(self.config.prefill)
            async for chunk in completions.sse_chunks(
                kind, model, words, self.config.token_rate, crash_at
            ):
                yield chunk
        except asyncio.CancelledError:
            counters["cancelled"] += 1
            raise
        except ConnectionResetError:
            counters["crashed"] += 1
            raise
        else:
            counters["completed"] += 1
        finally:
            counters["active"] -= 1

    def _refuse(self, request: Request) -> Response | None:
        key = self.config.api_key
        if key and request.headers.get("authorization") != f"Bearer {key}":
            return _error(401, "invalid_api_key", "the simulator wants its own --api-key")
        return None

    # -- llama-swap ----------------------------------------------------------------------------

    async def ok(self, _: Request) -> Response:
        return PlainTextResponse("OK")

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

    # -- Ollama --------------------------------------------------------------------------------

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


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    raise ClientGone


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(status: int, code: str, message: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status)


def _ollama_model(name: str) -> dict[str, Any]:
    return {"name": name, "model": name, "size": 1, "digest": "sim", "details": {}}
