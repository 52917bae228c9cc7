"""The one HTTP client of the control plane: drivers, kv_keep's slot calls, probes.

An engine closes a kept-alive connection after a few idle seconds (llama-server's is 5 s). A
call sent on it just as it closes gets no answer at all, nothing done on the server's side, and
httpx raises ``RemoteProtocolError``. The client's transport sends such a call once more, on a
new connection, so that no caller has to (docs/architecture.md, "Control calls").
"""

from __future__ import annotations

import httpx


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


def control_client() -> httpx.AsyncClient:
    """A client whose calls survive an engine closing an idle connection as they go out."""
    return httpx.AsyncClient(transport=_OnceMoreWhenClosed(httpx.AsyncHTTPTransport()))
