"""The Python floor: a bare Starlette + aiohttp passthrough with no logic at all.

``UPSTREAM=http://127.0.0.1:9000 uvicorn bench.passthrough:app``. Whatever swapgate costs beyond
this is the price of its features; this is what any Python proxy on this machine pays.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

# Several comma-separated upstreams are used in turn: a plain round-robin load balancer.
UPSTREAMS = itertools.cycle(os.environ.get("UPSTREAM", "http://127.0.0.1:9000").split(","))
session: aiohttp.ClientSession | None = None


@asynccontextmanager
async def lifespan(_: Starlette) -> AsyncIterator[None]:
    global session
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    yield
    await session.close()


async def proxy(request: Request) -> StreamingResponse:
    assert session is not None
    body = await request.body()
    headers = {"content-type": request.headers.get("content-type", "application/json")}
    target = next(UPSTREAMS) + request.url.path
    upstream = await session.post(target, data=body, headers=headers)

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.content.iter_any():
                yield chunk
        finally:
            upstream.release()

    kind = upstream.headers.get("content-type", "application/json")
    return StreamingResponse(relay(), status_code=upstream.status, media_type=kind)


app = Starlette(routes=[Route("/v1/{path:path}", proxy, methods=["POST"])], lifespan=lifespan)
