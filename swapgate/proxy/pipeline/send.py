"""A request sent upstream: to the lease's instance or relay (its engine slot first, on a
``kv_keep`` instance), again where the retry rule says after a failure before any byte reached
the client (swapgate/policy/retry.py, applied by swapgate/control/routing/failover.py), or to
its fallback model when the engine refuses its prompt as past the context."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from starlette.types import Scope

from swapgate.control.memory.kv import TurnSlots
from swapgate.control.routing.failover import Attempts
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Lease, Progress
from swapgate.errors import (
    UpstreamClosed,
    UpstreamError,
    UpstreamRefusedKey,
    UpstreamUnreachable,
)
from swapgate.metrics import Metrics
from swapgate.policy.idle_timeout import RequestedTimeouts
from swapgate.policy.retry import Failure, Next
from swapgate.policy.timing import retry_after
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.headers import upstream_headers
from swapgate.proxy.pipeline.fallback_models import FallbackModels
from swapgate.proxy.records import traced_upstream
from swapgate.proxy.request import Request, with_fields
from swapgate.proxy.upstream import UpstreamClient, UpstreamResponse
from swapgate.proxy.writer import ResponseWriter

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from swapgate.tracing.spans import Tracing

log = logging.getLogger("swapgate.access")
AUTH_STATUS = frozenset({401, 403})


class Sender:
    """Made for each config (a reload makes another); requests in flight keep theirs."""

    def __init__(
        self,
        registry: Registry,
        client: UpstreamClient,
        metrics: Metrics,
        turns: TurnSlots,
        config: tuple[RequestedTimeouts, FallbackModels],
        tracing: Tracing | None = None,
    ) -> None:
        """``config``: the ``keep_alive`` rules and the fallback models of this config."""
        self._registry, self._client, self._metrics = registry, client, metrics
        self._turns = turns
        self._requested_timeouts, self.fallbacks = config
        self.tracing = tracing

    async def open(
        self,
        scope: Scope,
        ex: Exchange,
        request: Request,
        writer: ResponseWriter,
        attempts: Attempts,
        progress: Progress,
    ) -> UpstreamResponse:
        """Send the request to the lease's upstream; a failure before any byte reached the
        client goes where the retry rule says (swapgate/policy/retry.py, applied by
        swapgate/control/routing/failover.py), a prompt its engine refuses as past the
        context to the model's fallback (``writer``: for the header that names it)."""
        lease = await attempts.first(progress)
        while True:
            ex.route, ex.waited = lease.route, ex.waited + lease.waited
            progress.route = lease.route  # early headers from now on name it
            lease = attempts.lease = await self._to_slot(ex, lease)
            try:
                response = await self._send(scope, ex, request, lease)
            except UpstreamError as exc:
                lease = await self._after_error(exc, ex, request, attempts, progress)
                continue
            failure = _status_failure(response)
            other = None  # a model with fallbacks: another, if its engine refused the length
            if failure is None and ex.fallback is not None:
                other = await self.fallbacks.past_context(ex, request, writer, response)
            if other is not None:
                response.close()
                lease = await attempts.instead(progress, *other)
                continue
            if failure is None:
                self._metrics.first_byte(ex.model, ex.route, time.perf_counter() - ex.started)
                return response
            place = attempts.after(failure, _held(ex), request.replayable)
            if place is None:
                self._metrics.first_byte(ex.model, ex.route, time.perf_counter() - ex.started)
                return response
            response.close()
            if place is Next.WAIT:  # backpressure, never the client's 429
                pause = retry_after(response.header("retry-after"))
                lease = await attempts.wait_for_room(progress, pause)
                continue
            self._metrics.upstream_errors.labels(lease.name, "http").inc()
            assert attempts.lease is not None
            lease = attempts.lease

    async def _after_error(
        self,
        exc: UpstreamError,
        ex: Exchange,
        request: Request,
        attempts: Attempts,
        progress: Progress,
    ) -> Lease:
        """Where a request goes after its upstream failed before answering (the retry rule);
        raises ``exc`` when nowhere."""
        lease = attempts.lease
        assert lease is not None
        if request.upload is not None and request.upload.gone:
            raise ConnectionAbortedError("the client went away during its upload") from exc
        self._metrics.upstream_errors.labels(lease.name, _error_kind(exc)).inc()
        if lease.kind == "instance":
            self._registry.polls.lost(lease.name, refused=_host_down(exc))
        place = attempts.after(_failure(exc), _held(ex), request.replayable)
        if place is None:
            raise exc
        if place is Next.PLACE:
            await attempts.place_again(progress)
        assert attempts.lease is not None
        log.warning(
            "%s failed (%s); %s goes to %s", lease.route, exc, ex.request_id, attempts.lease.route
        )
        return attempts.lease

    async def _to_slot(self, ex: Exchange, lease: Lease) -> Lease:
        """``lease`` with the engine slot this turn of its conversation goes to (``kv_keep``),
        the slot of an attempt before given back."""
        conversation = ex.routing.conversation if ex.routing is not None else None
        if ex.claim is None and not self._turns.keeps(lease, conversation):
            return lease
        claim, ex.claim = ex.claim, None
        await self._turns.free(claim)
        lease, ex.claim = await self._turns.claim(lease, conversation, ex.key)
        return lease

    async def _send(
        self, scope: Scope, ex: Exchange, request: Request, lease: Lease
    ) -> UpstreamResponse:
        path, body = scope["path"], request.body
        speaks = ex.endpoint.protocol in lease.upstream.protocols
        if lease.slot is not None and ex.endpoint.protocol == "anthropic":
            speaks = False  # llama-server's Messages endpoint drops id_slot: its chat keeps it
        ex.translation = None if speaks else request.translation
        if ex.translation is not None:
            path = ex.translation.path
            body = ex.translation.request(lease.upstream_model, ex.waited)
        elif lease.upstream_model != ex.model:
            body = request.renamed(lease.upstream_model)
        if lease.slot is not None and request.upload is None:
            body = with_fields(body, id_slot=lease.slot)
        body = self._requested_timeouts.body_for(body, lease, ex.keep_alive)
        url = lease.upstream.url_for(path) + _query(scope, lease.upstream.query)
        key = lease.upstream.api_key
        upload = request.upload
        ex.sent = time.perf_counter()
        if upload is None:
            messages = speaks and ex.endpoint.protocol == "anthropic"
            headers = upstream_headers(scope["headers"], ex.request_id, key, anthropic=messages)
            if ex.span is not None:
                headers = traced_upstream(self.tracing, ex, lease, headers)
            with self._registry.hangups.watch(lease.name):
                response = await self._client.open(
                    scope["method"], url, headers, body, lease.upstream.read_timeout
                )
        else:
            headers = upstream_headers(scope["headers"], ex.request_id, key, upload.headers())
            if ex.span is not None:
                headers = traced_upstream(self.tracing, ex, lease, headers)
            with self._registry.hangups.watch(lease.name):
                response = await self._client.open(
                    scope["method"], url, headers, upload.stream(), lease.upstream.read_timeout
                )
        if response.status in AUTH_STATUS:
            response.close()
            refused = UpstreamRefusedKey(_refused_key(lease, response.status))
            log.error("%s (request %s)", refused, ex.request_id)
            raise refused
        return response


def _held(ex: Exchange) -> float:
    """Seconds the upstream has held the request so far."""
    return time.perf_counter() - ex.sent


def _query(scope: Scope, extra: str = "") -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    both = "&".join(q for q in (query, extra) if q)
    return "?" + both if both else ""


def _failure(exc: UpstreamError) -> Failure:
    if isinstance(exc, UpstreamRefusedKey):
        return Failure.KEY
    if isinstance(exc, UpstreamClosed):
        return Failure.UNREAD if exc.unread else Failure.CLOSED
    return Failure.REFUSED


def _host_down(exc: UpstreamError) -> bool:
    return isinstance(exc, UpstreamUnreachable) and exc.host_down


def _status_failure(response: UpstreamResponse) -> Failure | None:
    """What an upstream's answer says for the retry rule; None: it is the answer."""
    if response.status == 429:
        return Failure.LIMITED
    if response.status not in (502, 503):
        return None
    return Failure.BODILESS if response.header("content-length") == "0" else Failure.REFUSAL


def _error_kind(exc: UpstreamError) -> str:
    if isinstance(exc, UpstreamRefusedKey):
        return "auth"
    return "connect" if isinstance(exc, UpstreamUnreachable) else "http"


def _refused_key(lease: Lease, status: int) -> str:
    where = lease.upstream.key_env
    fix = (
        f"check the key in ${where} (api_key_env)"
        if where
        else "it wants a key: set api_key_env for it"
    )
    return f"{lease.route} refused swapgate's key ({status}); the operator should {fix}"
