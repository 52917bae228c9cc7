"""A request's intake, read once before it is placed: the model it goes to (a selector picks
one of its targets), whether any of that model's instances can take its API, and its routing (its
pool by its prompt's length, its wait budget, its priority class, its conversation and client).
The router places what the intake read (router.py)."""

from __future__ import annotations

from typing import Any

from swapgate.config.catalog import Catalog
from swapgate.config.settings import Settings
from swapgate.control.routing.waiter import Routing
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.times import SwapTimes
from swapgate.data.warm import WarmState
from swapgate.errors import PathNotFound
from swapgate.policy import pools

_WARM = frozenset({WarmState.WARM})
_WAKING = frozenset({WarmState.LOADING, WarmState.ASLEEP})
# The APIs swapgate translates to chat completions for an instance that does not speak them
TRANSLATED = frozenset({"anthropic", "responses", "ollama"})


class Intake:
    def __init__(
        self, settings: Settings, registry: Registry, catalog: Catalog, times: SwapTimes
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._catalog = catalog
        self._times = times
        self._protocols = {inst.name: frozenset(inst.protocols) for inst in settings.instances}
        self._all_speak_openai = all("openai" in inst.protocols for inst in settings.instances)

    def check_speaks(self, model: str, protocol: str, path: str) -> None:
        """Refuse at once, before any swap, a request none of ``model``'s instances can take:
        its API spoken natively, or chat completions to translate it to (``openai``)."""
        if self._all_speak_openai:
            return  # every API translates to chat: nothing to refuse, and no snapshot
        if self._settings.model_settings(model).relay is not None:
            return  # the relay may speak it
        can = {protocol, "openai"} if protocol in TRANSLATED else {protocol}
        serving = [i.name for i in self._registry.snapshot().instances if model in i.serves]
        if not serving or any(can & self._protocols[name] for name in serving):
            return
        raise PathNotFound(
            f"no instance of {model!r} speaks {path} ({', '.join(serving)} speak "
            f"{sorted(self._protocols[serving[0]])}); add {protocol!r} to an "
            "instance's protocols, or send the request where it is spoken"
        )

    def routing_for(
        self,
        model: str,
        payload: dict[str, Any],
        budget: float | None,
        priority: int = 0,
        conversation: str | None = None,
        client: str | None = None,
    ) -> Routing:
        """What a request asks for besides its model: its pool (by its prompt, docs/operations.md),
        its own wait budget (``x-swapgate-max-wait``, capped at the model's max_wait), its
        priority class (docs/keys.md) and the conversation it is a turn of (docs/kv-keep.md)."""
        conf = self._settings.model_settings(model)
        pool = None
        if conf.pools:
            snap = self._registry.snapshot()
            pool = pools.choose(model, conf.pools, pools.prompt_tokens(payload), snap)
        max_wait = conf.max_wait or self._settings.routing.max_wait
        wait = min(budget, max_wait) if budget is not None else None
        return Routing(pool, wait, priority, conversation, client)

    def chosen(self, model: str) -> str:
        """The model a request for ``model`` goes to: ``model`` itself, or, for a selector, the
        first of its targets that is warm, then loading or asleep (waking), then with its
        weights in RAM (cached); the first target when none is (docs/configuration.md)."""
        choose = self._catalog.selectors.get(model)
        if choose is None:
            return model
        targets = choose.targets
        if choose.strategy == "first" or len(targets) == 1:
            return targets[0]
        held = {target: self._registry.copies.of(target) for target in targets}
        snap = self._registry.snapshot({name: None for names in held.values() for name in names})
        states = {
            target: {
                view.state_of(target)
                for view in map(snap.instance, held[target])
                if view.available(snap.now)
            }
            for target in targets
        }
        for tier in (_WARM, _WAKING):
            for target in targets:
                if states[target] & tier:
                    return target
        cached = [t for t in targets if self._times.tiers(t) == "cached"]
        return cached[0] if cached else targets[0]
