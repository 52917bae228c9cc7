"""What a swap, a restart or a trim does to an instance through its driver, besides loading:
conversations saved before a model leaves (``kv_keep``), the unload, the registry told of it,
and when each model left (a quick return is thrash)."""

from __future__ import annotations

from collections.abc import Mapping

from swapgate.config.catalog import Catalog
from swapgate.control.memory.kv import KvKeeper
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.claims import Claims
from swapgate.data.warm import Stage, WarmState
from swapgate.drivers import Driver


class SwapSteps:
    def __init__(
        self,
        registry: Registry,
        drivers: Mapping[str, Driver],
        catalog: Catalog,
        claims: Claims,
        keeper: KvKeeper | None,
    ) -> None:
        """``keeper``: conversations saved before an unload on ``kv_keep`` instances
        (control/memory/kv/); ``claims``: told of each eviction (the other replicas)."""
        self._registry = registry
        self.drivers, self.catalog = drivers, catalog
        self._claims = claims
        self._keeper = keeper
        self._left: dict[tuple[str, str], float] = {}  # (instance, model): when it left

    async def evict(self, instance: str, models: tuple[str, ...]) -> None:
        for model in models:
            await self.unload(instance, model)
            self.evicted(instance, model)

    async def unload(self, instance: str, model: str) -> None:
        """Unload ``model``, its conversations saved first where the instance keeps them."""
        await self.save(instance, (model,))
        await self.drivers[instance].unload(self.catalog.upstream_name(instance, model))

    async def save(self, instance: str, models: tuple[str, ...]) -> None:
        """Save the conversations of ``models``, about to leave ``instance``, where it keeps
        them (control/memory/kv/keeper.py): each model once, within ``kv_keep.save_timeout``."""
        keeper, driver = self._keeper, self.drivers[instance]
        if keeper is None or not keeper.keeps(instance):
            return
        for model in models:
            upstream = self.catalog.upstream_name(instance, model)
            own = driver.model_url(upstream)
            server = keeper.server(instance, own or driver.url, upstream, driver.headers)
            await keeper.save(instance, model, server)

    async def loaded(self, instance: str, model: str) -> None:
        """``model`` was loaded anew on ``instance``: its engine's slots are empty."""
        if self._keeper is not None:
            await self._keeper.loaded(instance, model)

    def evicted(self, instance: str, model: str) -> None:
        """``model`` left ``instance``: the registry, and the other replicas, learn it."""
        self._left[instance, model] = self._registry.clock()
        driver = self.drivers.get(instance)
        state = driver.evicts_to if driver else WarmState.COLD
        self._registry.swap_marks.evicted(instance, model, state)
        self._claims.evicted(instance, model)

    def left_at(self, instance: str, model: str) -> float | None:
        """When ``model`` last left ``instance`` (once: a swap back asks)."""
        return self._left.pop((instance, model), None)

    def load_stage(self, instance: str, model: str) -> Stage | None:
        """How far ``model``'s load on ``instance`` has got, as its engine announces it."""
        driver = self.drivers.get(instance)
        upstream = self.catalog.upstream_name(instance, model)
        return driver.load_stage(upstream) if driver is not None else None
