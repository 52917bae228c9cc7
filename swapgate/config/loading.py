"""Configuration: a YAML file, overridden by ``SWAPGATE_*`` environment variables.

``load_config`` is the one entry point. It returns a frozen ``Settings`` or raises ``ConfigError``
carrying every problem found, each prefixed by its YAML path (``instances[1].url: not a URL``),
after checking what no single field can: names that clash, aliases, preload jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from swapgate.config.cron import cron_trigger
from swapgate.config.settings import (
    ConfigError,
    KeyConfig,
    ModelConfig,
    PreloadConfig,
    Settings,
)
from swapgate.config.sizes import sizes

_UNKNOWN_KEY = "unknown key; check its spelling against the documented schema"


def load_config(path: str | Path) -> Settings:
    """Read, validate and cross-check the file at ``path``, and the keys file it names; raise
    ``ConfigError`` on any problem."""
    return parse_config(_read_yaml(Path(path)), Path(path).parent)


def parse_config(data: Mapping[str, Any], base: Path | None = None) -> Settings:
    """``data`` as settings; a relative ``auth.keys_file`` is found in ``base`` (the config
    file's folder; else the working one)."""
    # Only sections become keyword arguments: pydantic-settings takes ``_env_file`` and its other
    # ``_*`` options from them, and a key YAML read as a number or null cannot be one at all.
    sections = {key: value for key, value in data.items() if key in Settings.model_fields}
    try:
        settings = Settings(**sections)
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
    else:
        settings, problems = _with_keys_file(settings, base)
        problems += list(_cross_check(settings))
    problems += [f"{key}: {_UNKNOWN_KEY}" for key in data if key not in sections]
    if problems:
        raise ConfigError(problems)
    return settings


def _with_keys_file(settings: Settings, base: Path | None) -> tuple[Settings, list[str]]:
    """``settings`` with the keys of ``auth.keys_file`` added to ``auth.keys``."""
    name = settings.auth.keys_file
    if name is None:
        return settings, []
    path = (base or Path.cwd()) / name
    try:
        data = _read_yaml_value(path)
    except ConfigError as exc:
        return settings, [f"auth.keys_file: {p}" for p in exc.problems]
    if isinstance(data, dict) and set(data) <= {"keys"}:
        data = data.get("keys") or []
    if data is None:
        data = []
    if not isinstance(data, list):
        return settings, [f"auth.keys_file: {path}: expected a list of keys (or keys: [...])"]
    try:
        keys = [KeyConfig.model_validate(entry) for entry in data]
    except ValidationError as exc:
        return settings, [f"auth.keys_file ({path}) {_describe(err)}" for err in exc.errors()]
    auth = settings.auth.model_copy(update={"keys": [*settings.auth.keys, *keys]})
    return settings.model_copy(update={"auth": auth}), []


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, but a value its constructors cannot build is a YAML error at its line.

    They let Python's errors out: ``2001-13-01`` (read as a date) a ValueError, ``!!bool x`` a
    KeyError, ``!!timestamp x`` an AttributeError.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError) as exc:
            problem = f"cannot read {node.value!r} as {node.tag} ({exc}); quote it to keep a string"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _read_yaml(path: Path) -> dict[Any, Any]:
    data = _read_yaml_value(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of sections"])
    return data


def _read_yaml_value(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the file ({exc.strerror})"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 (byte {exc.start}); save it as UTF-8"]) from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: builds plain data only
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    except RecursionError:
        raise ConfigError([f"{path}: nested too deeply to read; flatten it"]) from None
    return data


def _describe(error: Mapping[str, Any]) -> str:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = _UNKNOWN_KEY
    return f"{path or '(top level)'}: {message}"


def _cross_check(settings: Settings) -> Iterable[str]:
    names = [inst.name for inst in settings.instances]
    for index, name in enumerate(names):
        if names.index(name) != index:
            yield f"instances[{index}].name: duplicate instance name {name!r}"
    models = set(settings.models)
    seen_aliases: dict[str, str] = {}
    for model, conf in settings.models.items():
        yield from _check_model(model, conf, settings, models, seen_aliases)
    jobs: set[str] = set()
    for index, job in enumerate(settings.preloads):
        yield from _check_preload(index, job, settings)
        if job.name in jobs:
            yield f"preloads[{index}].name: duplicate job name {job.name!r}"
        jobs.add(job.name)
    yield from sizes(settings.models)[1]  # a gguf that cannot be read
    yield from _check_fallback_loops(settings)
    yield from _check_keys(settings)


def _check_keys(settings: Settings) -> Iterable[str]:
    names: set[str] = set()
    hashes: dict[str, str] = {}
    for index, key in enumerate(settings.auth.keys):
        where = f"auth.keys[{index}]"
        if key.name in names:
            yield f"{where}.name: duplicate key name {key.name!r}"
        if key.sha256 in hashes:
            yield f"{where}.sha256: the same key as {hashes[key.sha256]!r}; give each its own"
        names.add(key.name)
        hashes.setdefault(key.sha256, key.name)


def _check_model(
    model: str,
    conf: ModelConfig,
    settings: Settings,
    models: set[str],
    seen_aliases: dict[str, str],
) -> Iterable[str]:
    where = f"models.{model}"
    instance_names = {inst.name for inst in settings.instances}
    for alias in conf.aliases:
        if alias in models:
            yield f"{where}.aliases: {alias!r} is already a model name"
        elif alias in seen_aliases:
            yield f"{where}.aliases: {alias!r} is already an alias of {seen_aliases[alias]!r}"
        seen_aliases[alias] = model
    for instance in conf.upstream_names:
        if instance not in instance_names:
            yield f"{where}.upstream_names.{instance}: no instance is named {instance!r}"
    pool_names = [pool.name for pool in conf.pools]
    for index, pool in enumerate(conf.pools):
        if pool_names.index(pool.name) != index:
            yield f"{where}.pools[{index}].name: duplicate pool name {pool.name!r}"
        for instance in pool.instances:
            if instance not in {i.name for i in settings.instances}:
                yield f"{where}.pools[{index}].instances: no instance is named {instance!r}"
    if conf.relay is not None and conf.relay not in settings.relays:
        known = ", ".join(sorted(settings.relays)) or "none defined"
        yield f"{where}.relay: no relay named {conf.relay!r} (relays: {known})"
    if conf.relay is None and conf.relay_policy != "off":
        yield f"{where}.fallback: {conf.fallback!r} needs a relay; set {where}.relay"
    if conf.choose is not None:
        yield from _check_selector(model, conf, settings)
    yield from _check_fallbacks(model, conf, settings)


def _check_selector(model: str, conf: ModelConfig, settings: Settings) -> Iterable[str]:
    """A selector names models that instances serve, and is served by none itself."""
    assert conf.choose is not None
    where = f"models.{model}.choose"
    served = {m for inst in settings.instances for m in inst.models or ()}
    if model in served:
        yield f"{where}: {model!r} is a model an instance serves; give the selector its own name"
    for target in conf.choose.targets:
        if target == model or settings.model_settings(target).choose is not None:
            yield f"{where}.from: {target!r} is a selector; name the models it stands for"
        elif served and target not in served and target not in settings.models:
            yield f"{where}.from: no instance serves {target!r} (they serve {sorted(served)})"


def _check_fallbacks(model: str, conf: ModelConfig, settings: Settings) -> Iterable[str]:
    """``fallbacks`` name other models of this gateway, each once (docs/configuration.md,
    "Fallback models")."""
    served = {m for inst in settings.instances for m in inst.models or ()}
    aliases = {alias: m for m, c in settings.models.items() for alias in c.aliases}
    for index, other in enumerate(conf.fallbacks):
        where = f"models.{model}.fallbacks[{index}]"
        if other == model:
            yield f"{where}: {model!r} names itself; name the other models that answer for it"
        elif other in conf.fallbacks[:index]:
            yield f"{where}: {other!r} is named twice; name each model once"
        elif other in aliases:
            yield f"{where}: {other!r} is an alias of {aliases[other]!r}; name the model"
        elif settings.model_settings(other).choose is not None:
            yield f"{where}: {other!r} is a selector; name the models it stands for"
        elif served and other not in served and other not in settings.models:
            yield f"{where}: no model named {other!r} (instances serve {sorted(served)})"


def _check_fallback_loops(settings: Settings) -> Iterable[str]:
    """A loop of ``fallbacks`` (a -> b -> a), told once, at the first model of it."""
    edges = {m: [o for o in c.fallbacks if o != m] for m, c in settings.models.items()}
    done: set[str] = set()
    for start in edges:
        cycle = _loop_from(start, edges, [], done)
        if cycle:
            chain = " -> ".join([*cycle, cycle[0]])
            yield (
                f"models.{cycle[0]}.fallbacks: a loop ({chain}); a fallback model's own "
                "fallbacks are not followed, so drop the one that points back"
            )


def _loop_from(
    model: str, edges: Mapping[str, list[str]], path: list[str], done: set[str]
) -> list[str] | None:
    """The first loop reached from ``model`` along ``path`` (depth first), or None; every
    model fully walked goes into ``done``."""
    if model in path:
        return path[path.index(model) :]
    if model in done:
        return None
    path.append(model)
    for other in edges.get(model, ()):
        cycle = _loop_from(other, edges, path, done)
        if cycle:
            done.update(cycle)
            return cycle
    path.pop()
    done.add(model)
    return None


def _check_preload(index: int, job: PreloadConfig, settings: Settings) -> Iterable[str]:
    where = f"preloads[{index}]"
    if job.auto and job.cron is not None:
        yield f"{where}: auto learns when to preload; drop cron, or drop auto to keep the cron"
    elif job.cron is None and not job.auto:
        yield f"{where}.cron: missing; give a cron such as '0 8 * * 1-5', or auto: true"
    try:
        cron_trigger(job.cron or "0 0 * * *", job.timezone)
    except Exception as exc:  # APScheduler raises ValueError or zoneinfo errors
        yield f"{where}: invalid cron {job.cron!r} or timezone {job.timezone!r}: {exc}"
    if job.instances > len(settings.instances):
        yield (
            f"{where}.instances: {job.instances} instances asked for, "
            f"only {len(settings.instances)} configured"
        )
