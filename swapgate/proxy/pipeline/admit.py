"""A request admitted: read, its caller checked and admitted under its key's limits, the model
that answers it resolved, its body shaped by the model's params, its routing (``Routing``) and the
keep-alive it gets while it waits decided. Anything refused here is refused before any work."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace

from starlette.types import Receive, Scope

from swapgate.config.catalog import Catalog
from swapgate.config.model_params import Params
from swapgate.config.settings import Settings
from swapgate.control.routing.key_limits import KeyLimits
from swapgate.control.routing.router import Router
from swapgate.control.state.registry import Registry
from swapgate.policy import conversation, pools
from swapgate.policy.idle_timeout import RequestedTimeouts
from swapgate.proxy.auth import Caller, ClientAuth
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.headers import header, wait_budget
from swapgate.proxy.keepalive import (
    OPT_OUT_HEADER,
    PROGRESS_HEADER,
    KeepalivePlan,
    plan_keepalive,
    progress_mode,
)
from swapgate.proxy.pipeline.fallback_models import FallbackModels
from swapgate.proxy.records import RequestRecords
from swapgate.proxy.request import Request, read_request, shape
from swapgate.proxy.upload import PLAIN_FORMATS
from swapgate.proxy.writer import ResponseWriter

# A body this large (an image in its first message, say) has its conversation read in a thread:
# hashing 30 MB holds the event loop for ~0.2 s
OFF_LOOP_BYTES = 256 * 1024


class Admission:
    """Made for each config (a reload makes another); requests in flight keep theirs."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        catalog: Catalog,
        auth: ClientAuth,
        parts: tuple[Registry, KeyLimits, RequestRecords, RequestedTimeouts, FallbackModels],
        params: Mapping[str, Params],
    ) -> None:
        """``parts``: the live registry, the keys' limits, the request records, the
        ``keep_alive`` rules and the fallback models; ``params``: each model's rule."""
        self._router, self._catalog, self._auth = router, catalog, auth
        self._registry, self._limits, self._records, timeouts, self._fallbacks = parts
        self._requested_timeouts = timeouts
        self._params = params
        self._keepalive = settings.keepalive_for
        self._max_body = settings.server.max_body_bytes

    async def admit(
        self, scope: Scope, receive: Receive, ex: Exchange, writer: ResponseWriter
    ) -> tuple[Request, KeepalivePlan | None]:
        """Read the request and decide what it is: its caller (admitted under the key's
        limits), the model that answers it, the wait it will take (``Routing``) and the
        keep-alive it gets. Raises a ``SwapgateError`` for a request refused before any work."""
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        endpoint = ex.endpoint
        caller = self._auth.check(headers)
        ex.key = caller.name
        request = await read_request(receive, headers, endpoint, self._max_body)
        requested = request.model
        ex.stream = request.stream
        named = self._resolve_model(caller, requested)
        ex.model = self._router.intake.chosen(named)
        if requested != ex.model:
            request.rename(ex.model)
        if named != ex.model:  # a selector chose: say which model answers
            writer.headers.append((b"x-swapgate-model", ex.model.encode()))
        self._router.intake.check_speaks(ex.model, endpoint.protocol, endpoint.path)
        ex.keep_alive = self._requested_timeouts.read(headers, request, ex.model, caller.key)
        shape(request, self._params, endpoint, ex.model)  # before the capture
        if caller.key is not None:
            ex.admission = await self._limits.admit(caller.key)
        priority = self._auth.priority(caller, headers)
        turn = await self._conversation(ex, request)
        budget = wait_budget(headers)
        ex.routing = self._router.intake.routing_for(
            ex.model, request.payload, budget, priority, turn, ex.key
        )
        self._fallbacks.early(ex, request, caller, writer, (budget, priority, turn))
        if request.stream:
            ex.prompt_tokens = pools.prompt_tokens(request.payload)
        if ex.routing.pool is not None:
            writer.headers.append((b"x-swapgate-pool", ex.routing.pool.name.encode()))
        ex.capture = self._records.capture_for(ex, headers, request)
        if ex.span is not None:
            limit = request.payload.get("max_tokens") or request.payload.get("max_output_tokens")
            ex.max_tokens = limit if isinstance(limit, int) else None
        return request, self._plan(scope, ex, request, caller)

    async def _conversation(self, ex: Exchange, request: Request) -> str | None:
        """The conversation this request is a turn of, where that can change where it goes
        (docs/kv-keep.md); a large prompt's is read off the event loop."""
        kind = ex.endpoint.label
        if kind not in conversation.SHAPES or not self._router.conversations.matter(ex.model):
            return None
        if len(request.body) < OFF_LOOP_BYTES:
            return conversation.identity(kind, ex.model, request.payload)
        return await asyncio.to_thread(conversation.identity, kind, ex.model, request.payload)

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
        self, scope: Scope, ex: Exchange, request: Request, caller: Caller
    ) -> KeepalivePlan | None:
        headers = scope["headers"]
        opted_out = header(headers, OPT_OUT_HEADER) == b"off"
        endpoint = ex.endpoint
        if request.upload and request.upload.fields.get("response_format") in PLAIN_FORMATS:
            endpoint = replace(endpoint, json_answer=False)  # text, SRT or WebVTT: no whitespace
        config = self._keepalive(ex.model)
        progress = progress_mode(header(headers, PROGRESS_HEADER), caller.key, config)
        return plan_keepalive(
            config, stream=request.stream, endpoint=endpoint, opted_out=opted_out, progress=progress
        )
