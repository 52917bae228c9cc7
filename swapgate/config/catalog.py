"""Model names: client-facing names, their aliases, and what each instance calls them."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from swapgate.config.settings import Settings
from swapgate.config.sizes import WeightFiles, sizes
from swapgate.errors import ModelNotFound


class Catalog:
    """Translates between the names clients send and the names instances know."""

    def __init__(self, settings: Settings) -> None:
        self.configured = frozenset(settings.models)
        # Selectors (docs/configuration.md): a name whose requests go to one of its targets
        self.selectors = {
            name: conf.choose for name, conf in settings.models.items() if conf.choose is not None
        }
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
        # Each sized model's estimated memory (docs/memory.md) and each model's context, its
        # ``context`` else its GGUF's: the headers read once per config (a file that cannot be
        # read was reported when the config loaded).
        found = sizes(settings.models)[0]
        self.sizes = {model: size.total for model, size in found.items()}
        self.contexts: dict[str, int] = {}
        for model, conf in settings.models.items():
            context = conf.context or (found[model].context if model in found else 0)
            if context:
                self.contexts[model] = context
        self.weights = weight_paths(settings)

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

    def weight_bytes(self) -> dict[str, int]:
        """The bytes of each model's weight files, where they can be read (a first swap's
        estimate: swapgate/control/swaps/coordinator.py)."""
        found = {}
        for model, files in self.weights.items():
            try:
                found[model] = sum(Path(f).stat().st_size for f in files)
            except OSError:
                continue
        return found

    def upstream_name(self, instance: str, model: str) -> str:
        return self._upstream.get((instance, model), model)

    def client_name(self, instance: str, upstream: str) -> str:
        return self._client.get((instance, upstream), upstream)


SHELLS = ("sh", "bash", "dash", "zsh")


def weight_paths(settings: Settings) -> dict[str, WeightFiles]:
    """Where each model's weights lie, where the config says (docs/host-cache.md): its
    ``weights`` files or folder, else its ``gguf``, else the file a ``process`` command loads
    (``-m``/``--model``)."""
    found: dict[str, WeightFiles] = {}
    for model, conf in settings.models.items():
        if isinstance(conf.weights, tuple):
            found[model] = conf.weights
        elif conf.gguf:
            found[model] = (conf.gguf,)
    for inst in settings.instances:
        for model, command in inst.commands.items():
            path = command_weights(command.cmd)
            if path is not None:
                found.setdefault(model, (path,))
    return found


def command_weights(cmd: str) -> str | None:
    """The weights file a server command loads: what follows ``-m`` or ``--model`` (llama.cpp's
    ``llama-server``, llama-cpp-python), when it is an absolute path; in ``sh -c 'SCRIPT'``,
    what follows it in the script."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    if len(words) > 2 and Path(words[0]).name in SHELLS and words[1] == "-c":
        return command_weights(words[2])
    for index, word in enumerate(words):
        value = None
        if word in ("-m", "--model") and index + 1 < len(words):
            value = words[index + 1]
        elif word.startswith("--model="):
            value = word.split("=", 1)[1]
        if value and value.startswith("/"):
            return value
    return None
