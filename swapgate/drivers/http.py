"""The one HTTP client of the control plane: drivers, kv_keep's slot calls, probes.

Each server has a connection pool of its own: httpcore's pool matches every request against
every connection it holds, and keeps 20 idle ones, so one pool for a fleet of 256 instances made
each round of polls cost the square of the fleet and open most connections anew
(docs/architecture.md, "Control calls").

An engine closes a kept-alive connection after a few idle seconds (llama-server's is 5 s). A
call sent on it just as it closes gets no answer at all, nothing done on the server's side, and
httpx raises ``RemoteProtocolError``. The client's transport sends such a call once more, on a
new connection, so that no caller has to (docs/architecture.md, "Control calls").
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

# Idle connections kept past the poll interval (5 s by default; httpx's own expiry is 5 s, so
# each poll opened a new one); a server that closed one sooner is seen to have, and a call that
# meets one as it closes goes once more (below).
LIMITS = httpx.Limits(keepalive_expiry=60.0)


class _OnceMoreWhenClosed(httpx.AsyncBaseTransport):
    """Sends a request again, once, when the server closed the connection before answering."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._transport.handle_async_request(request)
        except httpx.RemoteProtocolError:
            return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self._transport.aclose()


class _PoolPerServer(httpx.AsyncBaseTransport):
    """A transport (``make``'s) per server a request goes to, made at its first request."""

    def __init__(self, make: Callable[[], httpx.AsyncBaseTransport]) -> None:
        self._make = make
        self.pools: dict[tuple[bytes, bytes, int | None], httpx.AsyncBaseTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        server = (url.raw_scheme, url.raw_host, url.port)
        pool = self.pools.get(server)
        if pool is None:
            pool = self.pools[server] = self._make()
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            await pool.aclose()


def control_client() -> httpx.AsyncClient:
    """A client whose calls survive an engine closing an idle connection as they go out, with
    a connection pool per server."""
    tls = httpx.create_ssl_context()  # one for all: each takes milliseconds to make

    def pool() -> httpx.AsyncBaseTransport:
        return _OnceMoreWhenClosed(httpx.AsyncHTTPTransport(verify=tls, limits=LIMITS))

    return httpx.AsyncClient(transport=_PoolPerServer(pool))
