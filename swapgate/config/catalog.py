"""Model names: client-facing names, their aliases, and what each instance calls them."""

from __future__ import annotations

from collections.abc import Callable

from swapgate.config.settings import Settings
from swapgate.errors import ModelNotFound
from swapgate.model.sizes import sizes


class Catalog:
    """Translates between the names clients send and the names instances know."""

    def __init__(self, settings: Settings) -> None:
        self.configured = frozenset(settings.models)
        self._aliases = {
            alias: model for model, conf in settings.models.items() for alias in conf.aliases
        }
        self._upstream = {
            (instance, model): upstream
            for model, conf in settings.models.items()
            for instance, upstream in conf.upstream_names.items()
        }
        self._client = {
            (instance, upstream): model for (instance, model), upstream in self._upstream.items()
        }
        # Each sized model's estimated memory (docs/memory.md); a file that cannot be read was
        # reported when the config loaded.
        self.sizes = {model: size.total for model, size in sizes(settings.models)[0].items()}

    @property
    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def resolve(self, name: str) -> str:
        """The model an alias stands for, or the name itself."""
        return self._aliases.get(name, name)

    def known(
        self, requested: str, known: frozenset[str], visible: Callable[[str], bool] | None = None
    ) -> str:
        """The model ``requested`` names (an alias resolved), if it is among ``known``; else
        ``ModelNotFound`` listing every name a client may send (that it may see)."""
        model = self.resolve(requested)
        if model not in known:
            listed = sorted(known | self._aliases.keys())
            names = ", ".join(n for n in listed if visible is None or visible(n)) or "none yet"
            raise ModelNotFound(
                f"model {requested!r} does not exist here; known models: {names}", param="model"
            )
        return model

    def upstream_name(self, instance: str, model: str) -> str:
        return self._upstream.get((instance, model), model)

    def client_name(self, instance: str, upstream: str) -> str:
        return self._client.get((instance, upstream), upstream)
