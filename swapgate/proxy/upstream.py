"""The data plane's one HTTP client, behind the small interface the proxy needs.

aiohttp was chosen by measurement (docs/architecture.md): for a bare passthrough on 2 cores it
served ~5x the requests/s of a plain ``httpx.AsyncClient``. Bodies are never decompressed or
re-encoded: the bytes the upstream sends are the bytes the client gets.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import AsyncIterable, AsyncIterator, Sequence

import aiohttp

from swapgate.errors import UpstreamClosed, UpstreamError, UpstreamTimeout, UpstreamUnreachable

Headers = Sequence[tuple[str, str]]
Body = bytes | AsyncIterable[bytes]  # an upload streams through
RawHeaders = list[tuple[bytes, bytes]]
CONNECT_TIMEOUT = 10.0
# A connection that failed so says the instance is not there: down at once. Anything else
# (out of descriptors, out of local ports, a connect timeout) may be this side's or a moment's
# trouble: the instance is polled again soon instead (docs/operations.md).
HOST_DOWN = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})
# A reset, or a pipe closed before the request was written: the upstream never read it all
UNREAD = frozenset({errno.ECONNRESET, errno.EPIPE})
# Idle pooled connections are dropped well before servers drop them (uvicorn, under vLLM and the
# simulator, and llama-server's httplib: after 5 s): a request sent on a connection the server is
# closing fails without an answer. The pool's clock starts when the answer's end is read, the
# server's when it wrote it: a loop busy with a thousand streams read it a second late or more,
# which a 4 s pool let run into the server's close (likely the 1,000-stream test's one
# upstream_error, in one of four CI runs).
KEEPALIVE_TIMEOUT = 2.0


class UpstreamResponse:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.headers: RawHeaders = list(response.raw_headers)
        self.is_event_stream = (response.content_type or "").startswith("text/event-stream")
        self._head = b""  # read by ``peek``, still to be given by ``chunks``

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        """One of its headers' value (the first), if it sent it."""
        value = self._response.headers.get(name)
        return str(value) if value is not None else None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; a broken or stalled upstream raises ``UpstreamError``."""
        if self._head:
            head, self._head = self._head, b""
            yield head
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout("the upstream stalled mid-answer") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"the upstream broke off mid-answer ({type(exc).__name__})"
            ) from exc

    async def peek(self, limit: int = 4096) -> bytes:
        """The body's first bytes, as many as have come (at most ``limit``; waits for one read
        if none came yet); ``chunks`` still gives them. Empty when the body broke off."""
        content = self._response.content
        if len(self._head) < limit and not content.at_eof():
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):  # then: what came
                self._head += await content.read(limit - len(self._head))
        return self._head[:limit]

    async def excerpt(self, limit: int = 2048) -> str:
        """What an error answer says: its OpenAI ``error.message`` if it has one."""
        raw = await self.peek(limit)
        if not raw:
            return "(no body)"
        try:
            return str(json.loads(raw)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return raw.decode("utf-8", "replace").strip() or "(no body)"

    def close(self) -> None:
        """Drop the connection: called on every path, it also stops an abandoned generation."""
        self._response.close()

    def release(self) -> None:
        """Hand a fully read connection back to the pool."""
        self._response.release()


class UpstreamClient:
    def __init__(self, idle_timeout: float) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT, sock_read=idle_timeout
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_TIMEOUT
            ),
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def open(
        self,
        method: str,
        url: str,
        headers: Headers,
        body: Body,
        read_timeout: float | None = None,
    ) -> UpstreamResponse:
        """Send the request and return once the upstream's status and headers arrived;
        ``read_timeout`` replaces the idle timeout for this request (relays have their own)."""
        timeout = self._timeout
        if read_timeout is not None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=CONNECT_TIMEOUT, sock_read=read_timeout
            )
        assert self._session is not None, "UpstreamClient.start() was not awaited"
        try:
            response = await self._session.request(
                method, url, data=body, headers=headers, allow_redirects=False, timeout=timeout
            )
        except aiohttp.ClientConnectorError as exc:
            unreachable = UpstreamUnreachable(f"cannot connect to {url}: {exc.strerror}")
            unreachable.host_down = exc.errno in HOST_DOWN
            raise unreachable from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"{url} sent no answer in time") from exc
        except aiohttp.ClientError as exc:
            # Sent again or not by the one retry rule (swapgate/policy/retry.py)
            unread = isinstance(exc, ConnectionResetError) or getattr(exc, "errno", 0) in UNREAD
            said = f"{url} closed with no answer ({type(exc).__name__})"
            raise UpstreamClosed(said, unread=unread) from exc
        return UpstreamResponse(response)
