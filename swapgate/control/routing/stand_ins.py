"""Other models of this gateway that answer a request its own model cannot serve
(``models.M.fallbacks``, docs/configuration.md, "Fallback models"); the rule is
swapgate/policy/fallback_models.py, applied here to the router's view of each model.

A request gets one ``Chance``: at most one other model answers it, the first of its model's
``fallbacks`` that can. That model's own ``fallbacks`` are not followed (no chains), so that a
request never wanders the fleet and what answers it is read from one line of the config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from swapgate.config.settings import Settings
from swapgate.control.routing.router import Router
from swapgate.control.routing.waiter import Want
from swapgate.errors import SwapgateError
from swapgate.metrics import Metrics
from swapgate.policy.fallback_models import Outlook, Reason, stand_in, why_not

log = logging.getLogger("swapgate.router")


@dataclass(slots=True)
class Chance:
    """One request's one chance to be answered by another model: the model it asked for,
    its ``fallbacks``, whether its key may use a model (``allowed``), the ``Want`` it would
    have for a model (``want_for``: its pool, budget, class), its prompt's estimated tokens;
    once taken, the model that answers it and why."""

    model: str
    fallbacks: tuple[str, ...]
    allowed: Callable[[str], bool]
    want_for: Callable[[str], Want]
    prompt_tokens: int
    to: str | None = None
    reason: Reason | None = None


class StandIns:
    def __init__(
        self, settings: Settings, router: Router, metrics: Metrics, contexts: Mapping[str, int]
    ) -> None:
        """``contexts``: each model's context where known (``Catalog.contexts``)."""
        self._settings = settings
        self._router = router
        self._metrics = metrics
        self._contexts = contexts
        self._fallible = any(conf.fallbacks for conf in settings.models.values())

    def chance(
        self,
        model: str,
        allowed: Callable[[str], bool],
        want_for: Callable[[str], Want],
        prompt: Callable[[], int],
    ) -> Chance | None:
        """The request's chance, if its model has ``fallbacks`` (``prompt``: its tokens,
        counted only then)."""
        if not self._fallible:
            return None
        fallbacks = self._settings.model_settings(model).fallbacks
        if not fallbacks:
            return None
        return Chance(model, tuple(fallbacks), allowed, want_for, prompt())

    def outlook(self, model: str, want: Want, prompt_tokens: int) -> Outlook:
        """What ``model`` offers a request that wants ``want`` now."""
        router = self._router
        # Placed without its conversation: a look, not a choice of copy (affinity counts those)
        decision = router.place(model, replace(want, conversation=None), router.clock())
        expected = router.expected_wait(model, decision) if want.budget is not None else 0.0
        conf = self._settings.model_settings(model)
        relay = conf.fallback_policy if conf.relay else "off"
        context = self._contexts.get(model)
        return Outlook(decision, expected, want.budget, context, prompt_tokens, relay)

    def at_admission(self, chance: Chance, want: Want) -> str | None:
        """The model that answers instead, if the request's own cannot serve it now."""
        reason = why_not(self.outlook(chance.model, want, chance.prompt_tokens))
        return self.take(chance, reason) if reason is not None else None

    def take(self, chance: Chance, reason: Reason) -> str | None:
        """The first of the chance's ``fallbacks`` that can serve the request, counted and
        remembered on ``chance``; None once it was taken, or when none can."""
        if chance.to is not None:
            return None

        def outlook(model: str) -> Outlook | None:
            try:
                want = chance.want_for(model)
            except SwapgateError:  # e.g. its prompt fits none of that model's pools
                return None
            return self.outlook(model, want, chance.prompt_tokens)

        found = stand_in(chance.fallbacks, chance.allowed, outlook)
        if found is None:
            log.info(
                "%s cannot serve a request (%s) and none of its fallbacks can", chance.model, reason
            )
            return None
        chance.to, chance.reason = found, reason
        self._metrics.model_fallbacks.labels(chance.model, found, reason).inc()
        log.info("%s cannot serve a request (%s): %s answers it", chance.model, reason, found)
        return found
