"""The OpenAI-compatible POST endpoints, as one pure ASGI callable (docs/architecture.md).

Pure ASGI because bytes flow here: status and headers go out first, then the upstream's body
chunks as they arrive. Nothing is buffered beyond one chunk, and a client that goes away cancels
the whole exchange, which closes the upstream connection and stops the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from swapgate.activity.captures import Captures
from swapgate.activity.log import ActivityLog
from swapgate.config.catalog import Catalog
from swapgate.config.model_params import Params, by_model, params_for
from swapgate.config.settings import Settings
from swapgate.control.loops.decay import DecayWatch
from swapgate.control.loops.idle_unload import IdleUnloader
from swapgate.control.memory.kv import KvKeeper, TurnSlots
from swapgate.control.routing.failover import Attempts
from swapgate.control.routing.key_limits import KeyLimits
from swapgate.control.routing.router import Router
from swapgate.control.routing.stand_ins import StandIns
from swapgate.control.routing.waiter import Want
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Lease, Progress
from swapgate.errors import (
    InternalError,
    ShuttingDown,
    SwapgateError,
    UpstreamClosed,
    UpstreamError,
    UpstreamRefusedKey,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from swapgate.metrics import Metrics
from swapgate.policy import conversation, pools
from swapgate.policy.fallback_models import Reason, refused_for_context
from swapgate.policy.idle_timeout import IdleAsks
from swapgate.policy.retry import Failure, Next
from swapgate.policy.timing import retry_after
from swapgate.proxy.auth import Caller, ClientAuth
from swapgate.proxy.endpoints import ENDPOINTS, Endpoint
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.headers import (
    DROP_RESPONSE,
    header,
    route_headers,
    upstream_headers,
    wait_budget,
)
from swapgate.proxy.keepalive import (
    OPT_OUT_HEADER,
    PROGRESS_HEADER,
    Figures,
    KeepalivePlan,
    Pinger,
    Pinging,
    no_figure,
    plan_keepalive,
    progress_mode,
)
from swapgate.proxy.records import OPERATIONS, RequestRecords, traced_upstream
from swapgate.proxy.request import Request, read_request, with_fields
from swapgate.proxy.request_id import request_id
from swapgate.proxy.translate.translated import translation
from swapgate.proxy.upload import PLAIN_FORMATS
from swapgate.proxy.upstream import UpstreamClient, UpstreamResponse
from swapgate.proxy.writer import ON_DISCONNECT, BodyMode, ResponseWriter, until_disconnect

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from swapgate.tracing.spans import Tracing

# Set in a request's scope by the server when its read timeout cut the request's body
# (swapgate/server/connections.py): counted as 408, not as a client that went away.
TIMED_OUT = "swapgate.request_timed_out"
log = logging.getLogger("swapgate.access")
# A body this large (an image in its first message, say) has its conversation read in a thread:
# hashing 30 MB holds the event loop for ~0.2 s
OFF_LOOP_BYTES = 256 * 1024
AUTH_STATUS = frozenset({401, 403})


class ProxyEndpoint:
    """Every proxied POST (``ENDPOINTS``), from its bytes in to its answer out: read and admit
    the request, lease an instance or relay (the router), keep the client's connection alive
    while it waits, send it upstream, retry where the retry rule says, and relay the answer.

    Built once with what outlives a config reload (the registry, the upstream client, the
    metrics, the records); ``configure`` hands it the parts each config makes anew (router,
    catalog, auth), which requests already in flight keep using until they end."""

    def __init__(
        self,
        *,
        registry: Registry,
        client: UpstreamClient,
        metrics: Metrics,
        limits: KeyLimits,
        decay: DecayWatch,
        kv: KvKeeper | None = None,
        activity: ActivityLog | None = None,
        captures: Captures | None = None,
        figures: Figures | None = None,
        tracing: Tracing | None = None,
        idle: IdleUnloader | None = None,
    ) -> None:
        """``activity`` and ``captures``: what each request leaves behind (proxy/records.py);
        ``figures``: how far a running load has got, for the clients told its progress;
        ``tracing``: each request's spans (swapgate/tracing/), none when it is off; ``idle``:
        told of each request's keep_alive (swapgate/control/loops/idle_unload.py)."""
        self._idle = idle
        self.tracing = tracing
        self._figures = figures or no_figure
        self._registry = registry
        self._records = RequestRecords(registry, metrics, decay, activity, captures, tracing)
        self._client = client
        self._metrics = metrics
        self._limits = limits
        self._decay = decay
        self._turns = TurnSlots(kv)  # a conversation's engine slot (docs/kv-keep.md)

    @property
    def records_activity(self) -> bool:
        """Whether each request's row goes to the activity log (``activity.enabled``)."""
        return self._records.activity is not None

    def configure(
        self, settings: Settings, router: Router, catalog: Catalog, auth: ClientAuth
    ) -> None:
        """Take the parts that a config reload replaces; requests in flight keep the old ones."""
        self._router = router
        self._catalog = catalog
        self._auth = auth
        self._params = by_model(settings.models)  # models.M.params
        stand_ins = StandIns(settings, router, self._metrics, catalog.contexts)
        self._fallbacks = FallbackModels(stand_ins, router, auth, self._params)
        self._keepalive = settings.keepalive_for
        self._max_body = settings.server.max_body_bytes
        self._records.access_log = settings.server.access_log
        self._idle_asks = IdleAsks(settings, self._idle.asked if self._idle else None)

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
            request, plan = await self._admit(scope, receive, ex, writer)
            work = self._forward(scope, ex, request, writer, plan)
            # A server that tells of a disconnect (swapgate's) does so once the body is read
            told = scope.get(ON_DISCONNECT) if request.upload is None else None
            await until_disconnect(request.after_body(receive), work, told)
        except SwapgateError as exc:
            await self._report_failure(ex, writer, exc)
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
            await self._report_failure(ex, writer, internal)
        except asyncio.CancelledError:
            # The server is shutting down and shutdown_grace has run out (docs/operations.md, "What
            # a client sees in each failure"): the client is told so, in-band if the status went
            # out; never a silent cut, nor the ASGI server's plain-text 500.
            shutting = ShuttingDown("swapgate is shutting down; retry the request")
            with contextlib.suppress(Exception):
                await self._report_failure(ex, writer, shutting)
            raise
        finally:
            usage = ex.usage() if ex.tail else (None, None)
            await self._release_key(ex, usage)
            self._records.done(ex, ex.failed.status if ex.failed else writer.status, usage)

    async def _admit(
        self, scope: Scope, receive: Receive, ex: Exchange, writer: ResponseWriter
    ) -> tuple[Request, KeepalivePlan | None]:
        """Read the request and decide what it is: its caller (admitted under the key's
        limits), the model that answers it, the wait it will take (``Want``) and the
        keep-alive it gets. Raises a ``SwapgateError`` for a request refused before any work."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        endpoint = ex.endpoint
        caller = self._auth.check(headers)
        ex.key = caller.name
        request = await read_request(receive, headers, endpoint, self._max_body)
        requested = request.model
        ex.stream = request.stream
        named = self._resolve_model(caller, requested)
        ex.model = self._router.chosen(named)
        if requested != ex.model:
            request.rename(ex.model)
        if named != ex.model:  # a selector chose: say which model answers
            writer.headers.append((b"x-swapgate-model", ex.model.encode()))
        self._router.check_speaks(ex.model, endpoint.protocol, endpoint.path)
        ex.keep_alive = self._idle_asks.read(headers, request, ex.model, caller.key)
        shape(request, self._params, endpoint, ex.model)  # before the capture
        if caller.key is not None:
            ex.admission = await self._limits.admit(caller.key)
        priority = self._auth.priority(caller, headers)
        turn = await self._conversation(ex, request)
        budget = wait_budget(headers)
        ex.want = self._router.want(ex.model, request.payload, budget, priority, turn, ex.key)
        self._fallbacks.early(ex, request, caller, writer, (budget, priority, turn))
        if request.stream:
            ex.prompt_tokens = pools.prompt_tokens(request.payload)
        if ex.want.pool is not None:
            writer.headers.append((b"x-swapgate-pool", ex.want.pool.name.encode()))
        ex.capture = self._records.capture_for(ex, headers, request)
        if ex.span is not None:
            limit = request.payload.get("max_tokens") or request.payload.get("max_output_tokens")
            ex.max_tokens = limit if isinstance(limit, int) else None
        return request, self._plan(scope, ex, request, request.stream, caller)

    async def _conversation(self, ex: Exchange, request: Request) -> str | None:
        """The conversation this request is a turn of, where that can change where it goes
        (docs/kv-keep.md); a large prompt's is read off the event loop."""
        shape = ex.endpoint.label
        if shape not in conversation.SHAPES or not self._router.conversations.matter(ex.model):
            return None
        if len(request.body) < OFF_LOOP_BYTES:
            return conversation.identity(shape, ex.model, request.payload)
        return await asyncio.to_thread(conversation.identity, shape, ex.model, request.payload)

    def _resolve_model(self, caller: Caller, requested: str) -> str:
        """The model ``requested`` names, if the caller's key may use it (checked first, so
        that the answer is the same whether or not it exists), and it exists."""
        auth, catalog = self._auth, self._catalog
        auth.check_model(caller, requested, catalog.resolve(requested))
        visible = None
        if caller.key is not None:
            visible = lambda name: auth.allows(caller, name, catalog.resolve(name))  # noqa: E731
        return catalog.known(requested, self._registry.known_models(), visible)

    def _plan(
        self, scope: Scope, ex: Exchange, request: Request, stream: bool, caller: Caller
    ) -> KeepalivePlan | None:
        headers = scope["headers"]
        opted_out = header(headers, OPT_OUT_HEADER) == b"off"
        endpoint = ex.endpoint
        if request.upload and request.upload.fields.get("response_format") in PLAIN_FORMATS:
            endpoint = replace(endpoint, json_answer=False)  # text, SRT or WebVTT: no whitespace
        config = self._keepalive(ex.model)
        progress = progress_mode(header(headers, PROGRESS_HEADER), caller.key, config)
        return plan_keepalive(
            config, stream=stream, endpoint=endpoint, opted_out=opted_out, progress=progress
        )

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
        instead = lambda: self._fallbacks.late(ex, request, writer)  # noqa: E731
        attempts = Attempts(self._router, ex.model, ex.want, instead)
        try:
            try:
                response = await self._open(scope, ex, request, writer, attempts, progress)
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
                await self._answer(response, writer, ex, attempts.lease, pinging)
            finally:
                await _stop(pinging)
                response.close()
        finally:
            if ex.upstream_span is not None and self.tracing is not None:
                self.tracing.finish(ex.upstream_span, {}, ex.failed.code if ex.failed else "")
            self._idle_asks.served(ex.keep_alive, attempts.lease)  # before its end (idle unload)
            attempts.release()
            claim, ex.claim = ex.claim, None
            await self._turns.free(claim)

    async def _open(
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
                if request.upload is not None and request.upload.gone:
                    raise ConnectionAbortedError("the client went away during its upload") from exc
                self._metrics.upstream_errors.labels(lease.name, _error_kind(exc)).inc()
                failed_with = _failure(exc)
                if lease.kind == "instance":
                    self._registry.polls.lost(lease.name, refused=_host_down(exc))
                failed = lease.route
                place = attempts.after(failed_with, _held(ex), request.replayable)
                if place is None:
                    raise
                if place is Next.PLACE:
                    lease = await attempts.place_again(progress)
                assert attempts.lease is not None
                lease = attempts.lease
                said = "%s failed (%s); %s goes to %s"
                log.warning(said, failed, exc, ex.request_id, lease.route)
                continue
            failure = _status_failure(response)
            past_context = self._fallbacks.past_context
            other = await past_context(ex, request, writer, response) if failure is None else None
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

    async def _to_slot(self, ex: Exchange, lease: Lease) -> Lease:
        """``lease`` with the engine slot this turn of its conversation goes to (``kv_keep``),
        the slot of an attempt before given back."""
        conversation = ex.want.conversation if ex.want is not None else None
        if ex.claim is None and not self._turns.keeps(lease, conversation):
            return lease
        claim, ex.claim = ex.claim, None
        await self._turns.free(claim)
        lease, ex.claim = await self._turns.claim(lease, conversation, ex.key)
        return lease

    async def _answer(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """Pass the upstream's answer on: its status and headers if none went out yet, else
        (after keep-alives committed a 200) its body, or its failure in-band."""
        ex.committed_early = writer.started
        if not writer.started:
            headers = self._response_headers(response, ex)
            if ex.capture is not None:
                ex.capture.response_headers = headers
            events = response.is_event_stream
            if ex.translation is not None:
                headers = ex.translation.answer_headers(response.status, events, headers)
            mode: BodyMode = "events" if events else "body"
            await writer.start(response.status, headers, mode)
        elif ex.translation is not None:
            ex.translation.answer_headers(response.status, response.is_event_stream, [])
        elif not response.ok:
            detail = await response.excerpt()
            error = UpstreamError(f"{ex.route} answered {response.status}: {detail}")
            await self._report_failure(ex, writer, error)
            return
        await self._relay_body(response, writer, ex, lease, pinging)

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
        body = self._idle_asks.body_for(body, lease, ex.keep_alive)
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

    def _response_headers(
        self, response: UpstreamResponse, ex: Exchange
    ) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in response.headers if k.lower() not in DROP_RESPONSE]
        headers += route_headers(ex.route, ex.waited)
        if response.is_event_stream:
            headers.append((b"x-accel-buffering", b"no"))
        return headers

    async def _relay_body(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """Copy the upstream's body; keep-alives still ``pinging`` stop at its first byte. An
        upstream that breaks off or stalls past ``stream_idle_timeout`` after the status went
        out (docs/architecture.md) is told as the writer's mode allows; either way the request
        counts as failed."""
        translation, pulse, capture = ex.translation, lease.pulse, ex.capture
        # The answer's tail, for its usage: its row in the activity log, its key's tpm
        counts = ex.admission is not None and ex.admission.counts_tokens
        first, tail = True, self._records.activity is not None or counts or ex.span is not None
        if ex.admission is not None and ex.admission.settles_at_end:
            writer.hold_end(functools.partial(self._release_key, ex))
        try:
            async for chunk in response.chunks():
                pulse.beat()
                if first:
                    first = False
                    await self._first_chunk(response, writer, ex, lease, pinging)
                    pinging = None
                if translation is not None:
                    chunk = translation.feed(chunk)
                    if not chunk:
                        continue
                await writer.write(chunk)
                if tail:
                    ex.keep_tail(chunk)
                if capture is not None:
                    capture.add(chunk)
                if translation is not None and translation.finished:
                    break  # its last event is out: end the answer now (Codex hangs up on it)
            last = translation.close() if translation is not None else b""
        except (UpstreamError, UpstreamTimeout) as exc:
            kind = "stall" if isinstance(exc, UpstreamTimeout) else "broken"
            self._metrics.upstream_errors.labels(lease.name, kind).inc()
            log.warning("%s failed mid-answer for %s: %s", lease.route, ex.request_id, exc)
            await self._report_failure(ex, writer, exc)
            return
        if ex.committed_early and writer.mode == "events" and writer.dialect.sse:
            # the header went out with the wait so far; an SSE comment, which parsers skip
            last += b": swapgate waited %d ms\n\n" % round(ex.waited * 1000)
        if tail:
            ex.keep_tail(last)
        if capture is not None:
            capture.add(last)
        await writer.end(last)
        # What the upstream still sends after a translation's last event is read to its end,
        # so that its connection is used again.
        with contextlib.suppress(UpstreamError, UpstreamTimeout):
            async for _ in response.chunks():
                pass
        response.release()

    async def _release_key(
        self, ex: Exchange, usage: tuple[int | None, int | None] | None = None
    ) -> None:
        """Give back the request's place under its key's limits, with the tokens its answer
        spent (``usage``, read from its tail when not given): before the answer's end goes out
        where that matters (``settles_at_end``), else once it is over."""
        admission, ex.admission = ex.admission, None
        if admission is not None:
            tokens_in, tokens_out = usage or (ex.usage() if ex.tail else (None, None))
            await self._limits.release(admission, (tokens_in or 0) + (tokens_out or 0))

    async def _first_chunk(
        self,
        response: UpstreamResponse,
        writer: ResponseWriter,
        ex: Exchange,
        lease: Lease,
        pinging: Pinging | None,
    ) -> None:
        """The upstream's first byte: its time, a stream's TTFT from an instance (for the
        engine's decay: swapgate/control/loops/decay.py), and the keep-alives stop (their last
        words, if any, go out before it)."""
        ex.first_byte = time.perf_counter()
        if lease.kind == "instance" and response.is_event_stream:
            since = self._registry.warm_since(lease.name, lease.model)
            if since is not None:
                ttft = ex.first_byte - ex.sent
                self._decay.ttft(lease.name, lease.model, since, ex.prompt_tokens, ttft)
        if pinging is not None:
            farewell = await pinging.stop()
            writer.upstream_body(writer.mode == "pings")
            if farewell:  # the wait's total, to a client told the load's progress
                await writer.write(farewell)

    async def _report_failure(
        self, ex: Exchange, writer: ResponseWriter, exc: SwapgateError
    ) -> None:
        """The one way to report a failure: the writer knows what the client got so far."""
        ex.failed = exc
        if not writer.started:
            writer.headers += route_headers(ex.route, ex.waited)
        await writer.fail(exc)


class FallbackModels:
    """A request's way to one of its model's ``fallbacks`` (docs/configuration.md, "Fallback
    models") from the data plane: who may use which model (the key's scope, the API it
    speaks), and the request renamed for the model that answers."""

    def __init__(
        self, stand_ins: StandIns, router: Router, auth: ClientAuth, params: Mapping[str, Params]
    ) -> None:
        self._stand_ins = stand_ins
        self._router = router
        self._auth = auth
        self._params = params

    def early(
        self,
        ex: Exchange,
        request: Request,
        caller: Caller,
        writer: ResponseWriter,
        asks: tuple[float | None, int, str | None],
    ) -> None:
        """The request's chance, taken now if its model cannot serve it: its prompt is too
        long, it backs off, no instance can hold it, or its wait budget ends first."""
        budget, priority, turn = asks
        router, endpoint = self._router, ex.endpoint

        def want_for(model: str) -> Want:
            return router.want(model, request.payload, budget, priority, turn, ex.key)

        def allowed(model: str) -> bool:
            if not self._auth.allows(caller, model):
                return False
            try:
                router.check_speaks(model, endpoint.protocol, endpoint.path)
            except SwapgateError:
                return False
            return True

        tokens = lambda: pools.prompt_tokens(request.payload)  # noqa: E731
        ex.fallback = self._stand_ins.chance(ex.model, allowed, want_for, tokens)
        if ex.fallback is not None and ex.want is not None:
            to = self._stand_ins.at_admission(ex.fallback, ex.want)
            if to is not None:
                self._answer_with(ex, request, writer, to)

    def late(
        self, ex: Exchange, request: Request, writer: ResponseWriter
    ) -> tuple[str, Want] | None:
        """The swap the request waited for failed: the model of its ``fallbacks`` that answers
        it instead, and its ``Want`` there, if it has its chance still."""
        return self._instead(ex, request, writer, "swap_failed")

    async def past_context(
        self, ex: Exchange, request: Request, writer: ResponseWriter, response: UpstreamResponse
    ) -> tuple[str, Want] | None:
        """The engine's answer refuses the prompt as past its model's context (a prompt the
        estimate let through): the model of its ``fallbacks`` that answers instead, and its
        ``Want`` there. Only a request with its chance still reads the body."""
        chance = ex.fallback
        if chance is None or chance.to is not None or response.status != 400:
            return None
        if not refused_for_context(response.status, await response.peek()):
            return None
        return self._instead(ex, request, writer, "context")

    def _instead(
        self, ex: Exchange, request: Request, writer: ResponseWriter, reason: Reason
    ) -> tuple[str, Want] | None:
        chance = ex.fallback
        to = self._stand_ins.take(chance, reason) if chance is not None else None
        if to is None or ex.want is None:
            return None
        self._answer_with(ex, request, writer, to)
        return to, ex.want

    def _answer_with(
        self, ex: Exchange, request: Request, writer: ResponseWriter, model: str
    ) -> None:
        """``model`` answers the request: its body names it, is shaped by its params instead
        of the asked model's, and ``x-swapgate-model`` names it while headers can still be
        added (after early keep-alives, the answer's "model" alone)."""
        assert ex.fallback is not None
        ex.model = model
        ex.want = ex.fallback.want_for(model)
        request.rename(model)
        shape(request, self._params, ex.endpoint, model)
        named = [(k, v) for k, v in writer.headers if k != b"x-swapgate-model"]
        writer.headers[:] = [*named, (b"x-swapgate-model", model.encode())]


def shape(request: Request, rules: Mapping[str, Params], endpoint: Endpoint, model: str) -> None:
    """The body as ``model``'s params make it from what the client sent (docs/configuration.md,
    "Request parameters per model"), and its translation for an upstream that speaks chat only:
    the params a translation does not carry go into the chat body."""
    rule = params_for(rules, model, endpoint.label)
    request.change(rule.apply if rule is not None else None)
    if endpoint.protocol != "openai":
        into_chat = rule.into_chat(endpoint.protocol) if rule is not None else None
        request.translation = translation(
            endpoint, request.payload, model, request.stream, into_chat
        )


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


async def _stop(pinging: Pinging | None) -> None:
    if pinging is not None:
        await pinging.stop()
