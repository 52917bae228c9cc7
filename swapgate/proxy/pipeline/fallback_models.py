"""Fallback models: another model of this gateway answers a request its own model cannot serve
(``models.M.fallbacks``, docs/configuration.md, "Fallback models"). The rule (why a model
cannot serve now, which of its fallbacks can) is swapgate/policy/fallback_models.py, pure; this
module applies it to the router's view of each model and, from the data plane, decides who may
use which model (the key's scope, the API it speaks) and renames and shapes the request for the
model that answers.

A request gets one ``ModelFallback`` (swapgate/proxy/exchange.py): at most one other model
answers it, the first of its model's ``fallbacks`` that can. That model's own ``fallbacks`` are
not followed (no chains), so that a request never wanders the fleet and what answers it is read
from one line of the config. It is taken at admission (the prompt is past the model's context,
the model backs off, no instance can hold it, the wait budget ends first), when the swap it
waited for failed, or when the engine refuses the prompt as past its context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from swapgate.config.model_params import Params
from swapgate.config.settings import Settings
from swapgate.control.routing.router import Router
from swapgate.control.routing.waiter import Routing
from swapgate.errors import SwapgateError
from swapgate.metrics import Metrics
from swapgate.policy import pools
from swapgate.policy.fallback_models import (
    Outlook,
    Reason,
    first_able,
    refused_for_context,
    why_not,
)
from swapgate.proxy.auth import Caller, ClientAuth
from swapgate.proxy.exchange import Exchange, ModelFallback
from swapgate.proxy.request import Request, shape
from swapgate.proxy.upstream import UpstreamResponse
from swapgate.proxy.writer import ResponseWriter

log = logging.getLogger("swapgate.router")


class FallbackModels:
    def __init__(
        self,
        settings: Settings,
        router: Router,
        metrics: Metrics,
        contexts: Mapping[str, int],
        request_side: tuple[ClientAuth, Mapping[str, Params]],
    ) -> None:
        """``contexts``: each model's context where known (``Catalog.contexts``);
        ``request_side``: the client keys and each model's ``params``."""
        self._settings = settings
        self._router = router
        self._metrics = metrics
        self._contexts = contexts
        self._auth, self._params = request_side
        self._fallible = any(conf.fallbacks for conf in settings.models.values())

    # -- the data plane's three moments -------------------------------------------------

    def early(
        self,
        ex: Exchange,
        request: Request,
        caller: Caller,
        writer: ResponseWriter,
        asks: tuple[float | None, int, str | None],
    ) -> None:
        """The request's fallback, taken now if its model cannot serve it: its prompt is too
        long, it backs off, no instance can hold it, or its wait budget ends first."""
        if not self._fallible or not self._settings.model_settings(ex.model).fallbacks:
            return  # a model without fallbacks pays nothing for them
        budget, priority, turn = asks
        router, endpoint = self._router, ex.endpoint

        def routing_for(model: str) -> Routing:
            return router.intake.routing_for(model, request.payload, budget, priority, turn, ex.key)

        def allowed(model: str) -> bool:
            if not self._auth.allows(caller, model):
                return False
            try:
                router.intake.check_speaks(model, endpoint.protocol, endpoint.path)
            except SwapgateError:
                return False
            return True

        tokens = lambda: pools.prompt_tokens(request.payload)  # noqa: E731
        ex.fallback = self.offer(ex.model, allowed, routing_for, tokens)
        if ex.fallback is not None and ex.routing is not None:
            to = self.at_admission(ex.fallback, ex.routing)
            if to is not None:
                self._answer_with(ex, request, writer, to)

    def late(
        self, ex: Exchange, request: Request, writer: ResponseWriter
    ) -> tuple[str, Routing] | None:
        """The swap the request waited for failed: the model of its ``fallbacks`` that answers
        it instead, and its routing there, if its fallback is not taken yet."""
        return self._instead(ex, request, writer, "swap_failed")

    async def past_context(
        self, ex: Exchange, request: Request, writer: ResponseWriter, response: UpstreamResponse
    ) -> tuple[str, Routing] | None:
        """The engine's answer refuses the prompt as past its model's context (a prompt the
        estimate let through): the model of its ``fallbacks`` that answers instead, and its
        routing there. Only a request whose fallback is not taken yet reads the body."""
        fallback = ex.fallback
        if fallback is None or fallback.to is not None or response.status != 400:
            return None
        if not refused_for_context(response.status, await response.peek()):
            return None
        return self._instead(ex, request, writer, "context")

    # -- the router's view ----------------------------------------------------------------

    def offer(
        self,
        model: str,
        allowed: Callable[[str], bool],
        routing_for: Callable[[str], Routing],
        prompt: Callable[[], int],
    ) -> ModelFallback | None:
        """The request's fallback, if its model has ``fallbacks`` (``prompt``: its tokens,
        counted only then)."""
        if not self._fallible:
            return None
        fallbacks = self._settings.model_settings(model).fallbacks
        if not fallbacks:
            return None
        return ModelFallback(model, tuple(fallbacks), allowed, routing_for, prompt())

    def outlook(self, model: str, routing: Routing, prompt_tokens: int) -> Outlook:
        """What ``model`` offers a request with ``routing`` now."""
        router = self._router
        # Placed without its conversation: a look, not a choice of copy (affinity counts those)
        decision = router.place(model, replace(routing, conversation=None), router.clock())
        expected = router.expected_wait(model, decision) if routing.budget is not None else 0.0
        conf = self._settings.model_settings(model)
        relay = conf.relay_policy if conf.relay else "off"
        context = self._contexts.get(model)
        return Outlook(decision, expected, routing.budget, context, prompt_tokens, relay)

    def at_admission(self, fallback: ModelFallback, routing: Routing) -> str | None:
        """The model that answers instead, if the request's own cannot serve it now."""
        reason = why_not(self.outlook(fallback.model, routing, fallback.prompt_tokens))
        return self.take(fallback, reason) if reason is not None else None

    def take(self, fallback: ModelFallback, reason: Reason) -> str | None:
        """The first of the request's ``fallbacks`` that can serve it, counted and remembered
        on ``fallback``; None once it was taken, or when none can."""
        if fallback.to is not None:
            return None

        def outlook(model: str) -> Outlook | None:
            try:
                routing = fallback.routing_for(model)
            except SwapgateError:  # e.g. its prompt fits none of that model's pools
                return None
            return self.outlook(model, routing, fallback.prompt_tokens)

        found = first_able(fallback.fallbacks, fallback.allowed, outlook)
        if found is None:
            log.info(
                "%s cannot serve a request (%s) and none of its fallbacks can",
                fallback.model,
                reason,
            )
            return None
        fallback.to, fallback.reason = found, reason
        self._metrics.model_fallbacks.labels(fallback.model, found, reason).inc()
        log.info("%s cannot serve a request (%s): %s answers it", fallback.model, reason, found)
        return found

    # -- the request renamed ----------------------------------------------------------------

    def _instead(
        self, ex: Exchange, request: Request, writer: ResponseWriter, reason: Reason
    ) -> tuple[str, Routing] | None:
        fallback = ex.fallback
        to = self.take(fallback, reason) if fallback is not None else None
        if to is None or ex.routing is None:
            return None
        self._answer_with(ex, request, writer, to)
        return to, ex.routing

    def _answer_with(
        self, ex: Exchange, request: Request, writer: ResponseWriter, model: str
    ) -> None:
        """``model`` answers the request: its body names it, is shaped by its params instead
        of the asked model's, and ``x-swapgate-model`` names it while headers can still be
        added (after early keep-alives, the answer's "model" alone)."""
        assert ex.fallback is not None
        ex.model = model
        ex.routing = ex.fallback.routing_for(model)
        request.rename(model)
        shape(request, self._params, ex.endpoint, model)
        named = [(k, v) for k, v in writer.headers if k != b"x-swapgate-model"]
        writer.headers[:] = [*named, (b"x-swapgate-model", model.encode())]
