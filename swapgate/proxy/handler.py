"""The proxied POST endpoints, as one pure ASGI callable (docs/architecture.md, "The request
path"): a pipeline a request goes through once, each step the module that owns it:
admitted (swapgate/proxy/pipeline/admit.py), placed and sent with the retry rule
(swapgate/proxy/pipeline/send.py), its answer passed on (swapgate/proxy/pipeline/answer.py),
and recorded (swapgate/proxy/records.py).

Pure ASGI because bytes flow here: status and headers go out first, then the upstream's body
chunks as they arrive. Nothing is buffered beyond one chunk, and a client that goes away cancels
the whole exchange, which closes the upstream connection and stops the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import Receive, Scope, Send

from swapgate.config.catalog import Catalog
from swapgate.config.model_params import by_model
from swapgate.config.settings import Settings
from swapgate.control.memory.kv import KvKeeper, TurnSlots
from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.key_limits import KeyLimits
from swapgate.control.routing.router import Router
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Progress
from swapgate.errors import InternalError, ShuttingDown, SwapgateError
from swapgate.metrics import Metrics
from swapgate.policy.idle_timeout import RequestedTimeouts
from swapgate.proxy.auth import ClientAuth
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.keepalive import Figures, KeepalivePlan, Pinger, Pinging, no_figure
from swapgate.proxy.pipeline.admit import Admission
from swapgate.proxy.pipeline.answer import Answers, report_failure
from swapgate.proxy.pipeline.fallback_models import FallbackModels
from swapgate.proxy.pipeline.send import Sender
from swapgate.proxy.records import OPERATIONS, RequestRecords
from swapgate.proxy.request import Request
from swapgate.proxy.request_id import request_id
from swapgate.proxy.upstream import UpstreamClient
from swapgate.proxy.writer import ON_DISCONNECT, ResponseWriter, until_disconnect

# Set in a request's scope by the server when its read timeout cut the request's body
# (swapgate/server/connections.py): counted as 408, not as a client that went away.
TIMED_OUT = "swapgate.request_timed_out"
log = logging.getLogger("swapgate.access")


class ProxyEndpoint:
    """Every proxied POST (``ENDPOINTS``), from its bytes in to its answer out: admit the
    request, lease an instance or relay (the router), keep the client's connection alive while
    it waits, send it upstream, retry where the retry rule says, pass the answer on, record it.

    Built once with what outlives a config reload (the registry, the upstream client, the
    metrics, the records); ``configure`` makes the steps each config changes (admission and
    sending), which requests already in flight keep using until they end."""

    def __init__(
        self,
        *,
        registry: Registry,
        client: UpstreamClient,
        metrics: Metrics,
        limits: KeyLimits,
        records: RequestRecords,
        kv: KvKeeper | None = None,
        figures: Figures | None = None,
    ) -> None:
        """``records``: what each request leaves behind and reports to the control loops
        (proxy/records.py), its spans among them; ``figures``: how far a running load has got,
        for the clients told its progress."""
        self.tracing = records.tracing
        self._figures = figures or no_figure
        self._registry = registry
        self._records = records
        self._client = client
        self._metrics = metrics
        self._limits = limits
        self._turns = TurnSlots(kv)  # a conversation's engine slot (docs/kv-keep.md)
        self._answers = Answers(registry, metrics, limits, records)

    @property
    def records_activity(self) -> bool:
        """Whether each request's row goes to the activity log (``activity.enabled``)."""
        return self._records.activity is not None

    def configure(
        self, settings: Settings, router: Router, catalog: Catalog, auth: ClientAuth
    ) -> None:
        """Make the steps a config reload replaces; requests in flight keep the old ones."""
        params = by_model(settings.models)  # models.M.params
        contexts = catalog.contexts
        fallbacks = FallbackModels(settings, router, self._metrics, contexts, (auth, params))
        requested_timeouts = RequestedTimeouts(settings)
        self._records.access_log = settings.server.access_log
        parts = (self._registry, self._limits, self._records, requested_timeouts, fallbacks)
        self._admission = Admission(settings, router, catalog, auth, parts, params)
        config = (requested_timeouts, fallbacks)
        self._sender = Sender(
            self._registry, self._client, self._metrics, self._turns, config, self.tracing
        )
        self._router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        endpoint = ENDPOINTS[scope["path"]]
        ex = Exchange(scope["method"], endpoint, request_id(headers))
        tracing = self.tracing
        if tracing is None:
            await self._serve(scope, receive, send, ex)
            return
        ex.span = tracing.request(headers, OPERATIONS.get(endpoint.label, endpoint.label))
        with tracing.current(ex.span):  # a swap it starts is a child of its span
            await self._serve(scope, receive, send, ex)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, ex: Exchange) -> None:
        endpoint = ex.endpoint
        writer = ResponseWriter(send, [(b"x-request-id", ex.request_id.encode())], endpoint.dialect)
        try:
            request, plan = await self._admission.admit(scope, receive, ex, writer)
            work = self._forward(scope, ex, request, writer, plan)
            # A server that tells of a disconnect (swapgate's) does so once the body is read
            told = scope.get(ON_DISCONNECT) if request.upload is None else None
            await until_disconnect(request.after_body(receive), work, told)
        except SwapgateError as exc:
            await report_failure(ex, writer, exc)
        except ConnectionAbortedError:
            # nginx's "client closed request"; 408 if the connection layer timed the client out.
            # A client that hangs up once its whole answer went out lost nothing: it stays 200.
            if not writer.answered_in_full:
                writer.status = 408 if TIMED_OUT in (scope.get("extensions") or {}) else 499
        except Exception:  # a bug of ours: a shaped answer all the same (docs/operations.md)
            self._metrics.internal_errors.labels("request").inc()
            log.exception("internal error on %s (request %s)", ex.endpoint.path, ex.request_id)
            internal = InternalError(
                f"swapgate failed on this request ({ex.request_id}); it is logged, retry later"
            )
            await report_failure(ex, writer, internal)
        except asyncio.CancelledError:
            # The server is shutting down and shutdown_grace has run out (docs/operations.md, "What
            # a client sees in each failure"): the client is told so, in-band if the status went
            # out; never a silent cut, nor the ASGI server's plain-text 500.
            shutting = ShuttingDown("swapgate is shutting down; retry the request")
            with contextlib.suppress(Exception):
                await report_failure(ex, writer, shutting)
            raise
        finally:
            usage = ex.usage() if ex.tail else (None, None)
            await self._answers.release_key(ex, usage)
            self._records.done(ex, ex.failed.status if ex.failed else writer.status, usage)

    async def _forward(
        self,
        scope: Scope,
        ex: Exchange,
        request: Request,
        writer: ResponseWriter,
        plan: KeepalivePlan | None,
    ) -> None:
        progress = ex.progress = Progress()
        if ex.span is not None:
            progress.trail = []  # where it waited, for its spans
        pinging = None
        if plan is not None:
            pinger = Pinger(
                plan, writer, ex.model, progress, self._registry, self._metrics, self._figures
            )
            pinging = Pinging(pinger)
        sender = self._sender  # this config's, for the whole request
        instead = lambda: sender.fallbacks.late(ex, request, writer)  # noqa: E731
        attempts = Attempts(self._router, ex.model, ex.routing, instead)
        try:
            try:
                response = await sender.open(scope, ex, request, writer, attempts, progress)
            except BaseException:
                await _stop(pinging)
                raise
            if not (writer.started and response.ok):
                await _stop(pinging)
                pinging = None
            # Else keep-alives go on until the engine's first byte: it may have sent its
            # headers and still be reading a long prompt.
            assert attempts.lease is not None
            try:
                await self._answers.answer(response, writer, ex, attempts.lease, pinging)
            finally:
                await _stop(pinging)
                response.close()
        finally:
            if ex.upstream_span is not None and self.tracing is not None:
                self.tracing.finish(ex.upstream_span, {}, ex.failed.code if ex.failed else "")
            self._records.released(ex, attempts.lease)  # before its end (idle unload)
            attempts.release()
            claim, ex.claim = ex.claim, None
            if claim is not None:  # a kv_keep slot
                await self._turns.free(claim)


async def _stop(pinging: Pinging | None) -> None:
    if pinging is not None:
        await pinging.stop()
