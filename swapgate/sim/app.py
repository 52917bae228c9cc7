"""The simulator's HTTP face: the llama-swap, Ollama or OpenAI flavour, plus ``/sim/*``.

Like the real servers, a request for a cold model gets no header until the load is done. The
APIs it speaks (`apis.PATHS`: OpenAI's, and Anthropic's with ``protocols``) share one path
through `SimServer._generate`: key, body, model, load, then an answer of its kind.
``GET /sim/stats`` counts loads, unloads, completed and cancelled generations for tests and
rehearsals; ``POST /sim/faults`` changes the fault rates and load time of a running simulator.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import swapgate.sim.apis as apis
import swapgate.sim.completions as completions
from swapgate.sim.backend import Backend, LoadFailed, SimConfig
from swapgate.sim.flavours import LlamaSwapApi, OllamaApi, PlainApi
from swapgate.sim.vllm import SleepMode

T = TypeVar("T")
FAULTS = (
    "fail_load_rate",
    "crash_mid_stream_rate",
    "hang_rate",
    "bad_gateway_next",
    "bad_gateway_hold",
    "crash_on",
    "crash_after",
    "load_time",
    "ttft",
    "prefill",
    "token_rate",
    "grow_rss",
    "ttft_per_gib",
)
FORM_FIELD_LIMIT = 64 * 1024  # an upload's other fields; the file itself spools to disk
BODY_WANTED = {"transcription": "send multipart/form-data with a 'model' and a 'file'"}


class ClientGone(Exception):
    pass


class Flavour(Protocol):
    """The endpoints a backend kind has besides the OpenAI API (flavours.py, vllm.py)."""

    def routes(self) -> list[Route]: ...


def create_sim_app(config: SimConfig) -> Starlette:
    return Starlette(routes=SimServer(config).routes())


def create_sim_fleet(configs: Sequence[SimConfig]) -> ASGIApp:
    """One simulator per config, each with its own state, told apart by the port a request
    came in on: hundreds of instances in one process (bench/fleet.py on two cores)."""
    apps = {config.port: create_sim_app(config) for config in configs}

    async def fleet(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        app = apps.get(server[1]) if server else None
        if app is None:
            await Response("no simulator on this port", status_code=404)(scope, receive, send)
            return
        await app(scope, receive, send)

    return fleet


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
        ]
        for protocol in self.config.protocols:
            for path, kind in apis.PATHS[protocol].items():
                routes.append(Route(path, self._endpoint(kind), methods=["POST"]))
        flavours: dict[str, Callable[[Backend], Flavour]] = {
            "llama-swap": LlamaSwapApi,
            "ollama": OllamaApi,
            "openai": PlainApi,
            "vllm": SleepMode,
        }
        return routes + flavours[self.config.flavor](self.backend).routes()

    # -- /sim ----------------------------------------------------------------------------------

    async def stats(self, _: Request) -> JSONResponse:
        return JSONResponse(self.backend.stats())

    async def last_response(self, _: Request) -> Response:
        """The exact bytes of the last non-streamed answer, to check a proxy changed nothing."""
        return Response(self.backend.last_body, media_type="application/octet-stream")

    async def faults(self, request: Request) -> JSONResponse:
        changes = await request.json()
        for key in FAULTS:
            if key in changes:  # as the field's type: grow_rss counts bytes
                setattr(self.config, key, type(getattr(self.config, key))(changes[key]))
        return JSONResponse({key: getattr(self.config, key) for key in FAULTS})

    # -- OpenAI API ----------------------------------------------------------------------------

    async def list_models(self, _: Request) -> JSONResponse:
        data = [{"id": m, "object": "model", "owned_by": "sim"} for m in self.config.models]
        return JSONResponse({"object": "list", "data": data})

    def _endpoint(self, kind: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await self._generate(request, kind)

        return endpoint

    async def _generate(self, request: Request, kind: str) -> Response:
        refused = self._refuse(request, kind)
        if refused is not None:
            return refused
        if self.config.bad_gateway_next > 0:
            self.config.bad_gateway_next -= 1
            self.backend.counters["requests"] += 1
            await asyncio.sleep(self.config.bad_gateway_hold)
            return Response(status_code=502)
        async with _request_body(request, kind) as body:
            if body is None or "model" not in body:
                wanted = BODY_WANTED.get(kind, "send a JSON object with a 'model'")
                return _error_for(kind, 400, "invalid_request_error", wanted)
            model = body["model"]
            if model not in self.config.models:
                return _error_for(kind, 404, "model_not_found", f"model {model!r} not found")
            counters = self.backend.counters
            counters["requests"] += 1
            if self.config.crash_on and self.config.crash_on in json.dumps(body):
                await asyncio.sleep(self.config.crash_after)
                os._exit(70)  # as a crashed engine dies: at once, mid-request
            if self.config.grow_rss:
                self.backend.leaked.append(b"\x01" * self.config.grow_rss)  # written: resident
            try:
                return await _unless_disconnected(request, self._answer(kind, model, body))
            except ClientGone:
                counters["cancelled"] += 1
                return Response(status_code=499)
            except LoadFailed as exc:
                return _error_for(kind, 502, "load_failed", str(exc))

    async def _answer(self, kind: str, model: str, body: dict[str, Any]) -> Response:
        await self.backend.ensure_loaded(model)
        if self.backend.roll(self.config.hang_rate):
            self.backend.counters["hung"] += 1
            await asyncio.Event().wait()
        held = len(self.backend.leaked) * self.config.grow_rss / 2**30
        await asyncio.sleep(self.config.ttft + held * self.config.ttft_per_gib)
        instant = apis.INSTANT.get(kind)
        if instant is not None:
            return self._whole(await instant(model, body))
        api = apis.TOKEN_APIS[kind]
        said = api.reply(model, body, completions.max_tokens(body, self.config.max_tokens))
        if body.get("stream") is True:
            return StreamingResponse(
                self._stream(api, model, body, said), media_type="text/event-stream"
            )
        await asyncio.sleep(len(said.pieces) / self.config.token_rate)
        return self._whole(apis.as_json(api.whole(model, body, said)))

    def _whole(self, answer: apis.Whole) -> Response:
        self.backend.counters["completed"] += 1
        self.backend.last_body = answer.content
        return Response(answer.content, media_type=answer.media_type)

    async def _stream(
        self, api: apis.TokenApi, model: str, body: dict[str, Any], said: completions.Reply
    ) -> AsyncIterator[bytes]:
        counters = self.backend.counters
        crash = self.backend.roll(self.config.crash_mid_stream_rate)
        pace = completions.Pace(self.config.token_rate, len(said.pieces) // 2 if crash else None)
        counters["active"] += 1
        try:
            await asyncio.sleep(self.config.prefill)
            async for chunk in api.stream(model, body, said, pace):
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

    def _refuse(self, request: Request, kind: str) -> Response | None:
        key = self.config.api_key
        if not key or request.headers.get("authorization") == f"Bearer {key}":
            return None
        if kind in apis.ANTHROPIC and request.headers.get("x-api-key") == key:
            return None
        return _error_for(kind, 401, "invalid_api_key", "the simulator wants its own --api-key")


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


@asynccontextmanager
async def _request_body(request: Request, kind: str) -> AsyncIterator[dict[str, Any] | None]:
    """The request's JSON object, or for an upload its form (files closed after); None if bad."""
    if kind != "transcription":
        try:
            body = await request.json()
        except ValueError:
            body = None
        yield body if isinstance(body, dict) else None
        return
    try:
        form = await request.form(max_files=1, max_fields=16, max_part_size=FORM_FIELD_LIMIT)
    except HTTPException:  # a form beyond those limits, or not a form at all
        yield None
        return
    try:
        yield dict(form) if isinstance(form.get("file"), UploadFile) else None
    finally:
        await form.close()


def _error_for(kind: str, status: int, code: str, message: str) -> JSONResponse:
    if kind in apis.ANTHROPIC:
        return JSONResponse(apis.anthropic_error(status, message), status_code=status)
    return _error(status, code, message)


def _error(status: int, code: str, message: str) -> JSONResponse:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return JSONResponse({"error": error}, status_code=status)
