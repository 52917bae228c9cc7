"""The admin API (docs/operations.md): state, preload, unload, drain, jobs and reload, behind a
token."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from swapgate.config.settings import ConfigError, Duration
from swapgate.control.loops.preload import PreloadResult
from swapgate.control.loops.scheduler import describe_result
from swapgate.data.warm import WarmState
from swapgate.errors import BadRequest, Conflict, DriverError, PathNotFound, SwapgateError
from swapgate.server.routes.activity import DURATION, activity_routes
from swapgate.server.runtime import Runtime
from swapgate.server.state_view import describe_state

# Seconds, or a duration (5m) as in the config
PIN_FOR = {"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION}]}


class PreloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    instance: str | None = None
    count: Annotated[int, Field(ge=1)] = 1
    pin_for: Annotated[Duration, WithJsonSchema(PIN_FOR)] = 0.0


class UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    instance: str | None = None


def admin_routes(runtime: Runtime) -> APIRouter:
    def authorized(request: Request) -> None:
        write = request.method not in ("GET", "HEAD")
        runtime.configured.admin_auth.check(request.headers.raw, request.url.path, write=write)

    router = APIRouter(prefix="/admin", dependencies=[Depends(authorized)])

    @router.get("/state")
    async def state() -> dict[str, Any]:
        described = describe_state(runtime)
        described["cluster"] = await runtime.describe_cluster()
        return described

    @router.post("/preload")
    async def preload(body: PreloadRequest, wait: bool = True) -> JSONResponse:
        model = _known_model(runtime, body.model)
        _known_instance(runtime, body.instance)
        work = runtime.configured.preloader.preload(model, body.count, body.instance, body.pin_for)
        if not wait:
            runtime.spawn(work)
            return JSONResponse({"status": "started", "model": model}, status_code=202)
        result = await work
        return JSONResponse(describe_result(result), status_code=200 if result.ok else 503)

    @router.post("/unload")
    async def unload(body: UnloadRequest) -> dict[str, Any]:
        model = _known_model(runtime, body.model)
        _known_instance(runtime, body.instance)
        return {"model": model, "unloaded": await unload_model(runtime, model, body.instance)}

    @router.post("/instances/{name}/drain")
    async def drain(name: str) -> dict[str, Any]:
        return _set_drained(runtime, name, True)

    @router.post("/instances/{name}/undrain")
    async def undrain(name: str) -> dict[str, Any]:
        return _set_drained(runtime, name, False)

    _job_routes(router, runtime)
    activity_routes(router, runtime)
    return router


def _job_routes(router: APIRouter, runtime: Runtime) -> None:
    """The preload jobs and the config reload."""

    @router.get("/jobs")
    async def jobs() -> dict[str, Any]:
        return {"jobs": runtime.scheduler.describe() if runtime.scheduler else []}

    @router.post("/jobs/{name}/run")
    async def run_job(name: str) -> JSONResponse:
        if runtime.scheduler is None or not runtime.scheduler.has(name):
            raise PathNotFound(f"no preload job named {name!r}; GET /admin/jobs lists them")
        result: PreloadResult = await runtime.scheduler.run(name)
        return JSONResponse(describe_result(result), status_code=200 if result.ok else 503)

    @router.post("/reload")
    async def reload() -> JSONResponse:
        try:
            settings = await runtime.reload()
        except ConfigError as exc:
            error = BadRequest("the config file is invalid; the running config stays")
            body = {"error": {**_error_fields(error), "problems": exc.problems}}
            return JSONResponse(body, status_code=400)
        names = [inst.name for inst in settings.instances]
        return JSONResponse({"status": "reloaded", "instances": names})


def _known_model(runtime: Runtime, requested: str) -> str:
    return runtime.configured.catalog.known(requested, runtime.registry.known_models())


def _known_instance(runtime: Runtime, name: str | None) -> None:
    if name is not None and not runtime.registry.has(name):
        raise PathNotFound(f"no instance named {name!r}; known: {runtime.registry.names()}")


async def unload_model(runtime: Runtime, model: str, only: str | None = None) -> list[str]:
    """Unload ``model`` from every instance holding it (or ``only`` that one): a ``Conflict``
    while a copy serves or its instance swaps. Returns the instances it left."""
    snap = runtime.registry.snapshot()
    holders = [
        i
        for i in snap.instances
        if i.state_of(model) is not WarmState.COLD and only in (None, i.name)
    ]
    for inst in holders:
        if inst.models[model].inflight or runtime.coordinator.busy(inst.name):
            raise Conflict(
                f"{model!r} on {inst.name} is serving or swapping; drain it "
                f"(POST /admin/instances/{inst.name}/drain) and retry"
            )
    for inst in holders:
        try:
            await runtime.coordinator.unload(inst.name, model)
        except DriverError as exc:
            raise Conflict(f"{inst.name} refused to unload {model!r}: {exc}") from exc
    return [inst.name for inst in holders]


def _set_drained(runtime: Runtime, name: str, drained: bool) -> dict[str, Any]:
    _known_instance(runtime, name)
    runtime.registry.operator.set_drained(name, drained)
    return {"instance": name, "drained": drained}


def _error_fields(error: SwapgateError) -> dict[str, Any]:
    return {"message": error.message, "type": error.type, "param": None, "code": error.code}
