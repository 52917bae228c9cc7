"""A request's way to one of its model's ``fallbacks`` from the data plane (docs/configuration.md,
"Fallback models"): who may use which model (the key's scope, the API it speaks), and the
request renamed and shaped for the model that answers. The rule is
swapgate/policy/fallback_models.py, applied to the router's view by
swapgate/control/routing/stand_ins.py."""

from __future__ import annotations

from collections.abc import Mapping

from swapgate.config.model_params import Params
from swapgate.control.routing.router import Router
from swapgate.control.routing.stand_ins import StandIns
from swapgate.control.routing.waiter import Want
from swapgate.errors import SwapgateError
from swapgate.policy import pools
from swapgate.policy.fallback_models import Reason, refused_for_context
from swapgate.proxy.auth import Caller, ClientAuth
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.request import Request, shape
from swapgate.proxy.upstream import UpstreamResponse
from swapgate.proxy.writer import ResponseWriter


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
