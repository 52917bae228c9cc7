"""``create_app(settings)``: the ASGI application; its lifespan starts and closes the Runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swapgate import __version__
from swapgate.config.settings import Settings
from swapgate.errors import (
    BadRequest,
    InternalError,
    MethodNotAllowed,
    PathNotFound,
    ShuttingDown,
    SwapgateError,
)
from swapgate.metrics import Metrics
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.server.event_stream import EventStream
from swapgate.server.openapi import install as install_contract
from swapgate.server.routes.admin import admin_routes
from swapgate.server.routes.ollama import LOAD_PATHS, OllamaFront, ollama_routes
from swapgate.server.routes.public import Listing, public_routes
from swapgate.server.routes.ui import dashboard_routes
from swapgate.server.runtime import Runtime

PROXIED_PATHS = tuple(ENDPOINTS)
PROXIED = frozenset(PROXIED_PATHS)
log = logging.getLogger("swapgate.server")


class SwapgateApp:
    """The ASGI entry point: the proxied POSTs go straight to the pure-ASGI endpoint, without
    FastAPI's middleware stack between the bytes and the client; everything else is FastAPI."""

    def __init__(self, api: FastAPI, runtime: Runtime) -> None:
        self.api = api
        self.runtime = runtime
        self._endpoint = runtime.endpoint
        self._ollama = OllamaFront(runtime, runtime.endpoint)  # a prompt-less load or unload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        try:
            if scope["method"] == "POST" and scope["path"] in LOAD_PATHS:
                await self._ollama(scope, receive, send)
            elif scope["method"] == "POST" and scope["path"] in PROXIED:
                await self._endpoint(scope, receive, send)
            else:
                await _answered(self.api, scope, receive, send)
        except asyncio.CancelledError:
            # The ASGI server cancels what is still running once shutdown_grace runs out; the
            # client was told (503 shutting_down, in-band if its status went out). This is the
            # request's own task, which nothing awaits: it ends here, with a line in the log
            # instead of the server's traceback.
            log.warning("%s %s cut short: shutdown_grace ran out", scope["method"], scope["path"])


async def _answered(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Every request FastAPI serves ends OpenAI-shaped (docs/operations.md). An unforeseen exception
    was answered and logged by the ``internal_error`` handler; Starlette re-raises it only for the
    server to log again, as a traceback: it ends here. A request still unanswered when
    ``shutdown_grace`` runs out is cancelled: ``503 shutting_down``, not uvicorn's plain 500."""
    started = False

    async def tracked(message: Message) -> None:
        nonlocal started
        started = started or message["type"] == "http.response.start"
        await send(message)

    try:
        await app(scope, receive, tracked)
    except asyncio.CancelledError:
        if not started:
            shutting = ShuttingDown("swapgate is shutting down; retry the request")
            with contextlib.suppress(Exception):
                await _error_response(shutting)(scope, receive, send)
        raise
    except Exception:
        if not started:
            raise


def create_app(settings: Settings, config_path: str | Path | None = None) -> SwapgateApp:
    """The gateway; ``config_path`` is the file ``POST /admin/reload`` and SIGHUP re-read."""
    runtime = Runtime(settings, config_path)
    events = EventStream(runtime)  # the dashboard's, and any script's

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await events.aclose()
            await runtime.aclose()

    app = FastAPI(
        title="swapgate", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    # Also routed here, so FastAPI answers other methods on these paths with 405.
    for path in PROXIED_PATHS:
        app.router.routes.append(Route(path, runtime.endpoint, methods=["POST"]))
    listing = Listing(runtime)
    app.include_router(public_routes(runtime, listing))
    app.include_router(ollama_routes(runtime, listing))
    app.include_router(admin_routes(runtime))
    app.include_router(dashboard_routes(runtime, events))
    _install_error_handlers(app, runtime.metrics)
    install_contract(app)
    return SwapgateApp(app, runtime)


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    async def swapgate_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, SwapgateError)
        return _error_response(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            error: SwapgateError = MethodNotAllowed(f"{request.method} is not allowed here")
        else:
            paths = ", ".join(PROXIED_PATHS)
            error = PathNotFound(f"no endpoint at {request.url.path}; the API is at {paths}")
        response = _error_response(error)
        response.headers.update(exc.headers or {})  # a 405's Allow (RFC 9110)
        return response

    async def validation_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return _error_response(BadRequest(f"invalid request: {_invalid(exc)}"))

    async def internal_error(request: Request, exc: Exception) -> Response:
        # Starlette's last resort would be a plain-text 500 (docs/operations.md): a shaped one,
        # the traceback in the log, counted.
        metrics.internal_errors.labels("request").inc()
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error_response(InternalError("swapgate failed on this request; retry later"))

    app.add_exception_handler(SwapgateError, swapgate_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)


def _invalid(exc: RequestValidationError) -> str:
    """What was wrong, field by field: never the endpoint's source file and line, which
    FastAPI's own text of the error carries."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        got = error.get("input")
        short = isinstance(got, str | int | float) and len(str(got)) < 60
        shown = f" (got {got!r})" if short else ""
        problems.append(f"{where}: {_in_words(error)}{shown}")
    return "; ".join(problems) or "the request does not match what this endpoint takes"


def _in_words(error: Any) -> str:
    """The problem as the person sending it can fix it: the API's only patterns are durations
    (swapgate/server/routes/activity.py), which pydantic would show as a regular expression."""
    if error.get("type") == "string_pattern_mismatch":
        return "not a duration: use e.g. 250ms, 5s, 2m, 1h or seconds, greater than 0 for bucket"
    return str(error.get("msg", "invalid"))


def _error_response(exc: SwapgateError) -> Response:
    headers = {k.decode(): v.decode() for k, v in exc.headers()}
    return Response(exc.body(), status_code=exc.status, headers=headers)
