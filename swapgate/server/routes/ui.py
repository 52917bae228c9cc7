"""The operator's page (``GET /ui``) and the event stream it follows (``GET /admin/events``):
docs/operations.md, "The dashboard".

The page's files ship in the package (swapgate/server/ui/): no build step, no CDN. The page
itself holds no data, only a login form; everything it shows comes from the admin API with
the token the operator typed, sent as a header (kept in the tab's session storage, never in a
URL). Its Content-Security-Policy allows no inline script and no other origin.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from swapgate.errors import PathNotFound
from swapgate.server.event_stream import EventStream
from swapgate.server.runtime import Runtime

UI = Path(__file__).resolve().parent.parent / "ui"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def dashboard_routes(runtime: Runtime, events: EventStream) -> APIRouter:
    def authorized(request: Request) -> None:
        runtime.configured.admin_auth.check(request.headers.raw, request.url.path, write=False)

    router = APIRouter()

    @router.get("/ui", response_class=HTMLResponse)
    async def page() -> Response:
        return _file("index.html")

    @router.get("/ui/{name}")
    async def asset(name: str) -> Response:
        return _file(name)

    @router.get(
        "/admin/events",
        dependencies=[Depends(authorized)],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
    )
    async def stream(request: Request) -> StreamingResponse:
        viewer = events.watch()
        return StreamingResponse(
            events.stream(viewer, request.scope),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    return router


def _file(name: str) -> Response:
    if name not in FILES:
        raise PathNotFound(f"no file {name!r} in the dashboard; it is at /ui")
    return Response(_read(name), media_type=FILES[name], headers=HEADERS)


@cache
def _read(name: str) -> bytes:
    """Read once: the files are the package's, and change only with it."""
    return (UI / name).read_bytes()
