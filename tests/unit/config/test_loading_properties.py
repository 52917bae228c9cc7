"""Properties over any input: the config loader raises only ``ConfigError``, whose every
problem names the path it is about."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from swapgate.config.loading import load_config, parse_config
from swapgate.config.settings import (
    ActivityConfig,
    AuthConfig,
    CaptureConfig,
    ClusterConfig,
    ConfigError,
    DiagnosisConfig,
    HostCacheConfig,
    InstanceConfig,
    KeepaliveConfig,
    KeepaliveOverride,
    MetricsConfig,
    ModelConfig,
    PreloadConfig,
    RelayConfig,
    RoutingConfig,
    ServerConfig,
    Settings,
    TracingConfig,
)
from tests.unit.strategies import BOUNDED, JSON, SCALARS

# --- the config loader ----------------------------------------------------------------------

# Where each top-level key's keys come from: a section, a list of entries, or named entries.
SECTIONS: dict[str, type[BaseModel]] = {
    "server": ServerConfig,
    "routing": RoutingConfig,
    "keepalive": KeepaliveConfig,
    "metrics": MetricsConfig,
    "cluster": ClusterConfig,
    "auth": AuthConfig,
    "diagnosis": DiagnosisConfig,
    "host_cache": HostCacheConfig,
    "activity": ActivityConfig,
    "capture": CaptureConfig,
    "tracing": TracingConfig,
}
LISTS: dict[str, type[BaseModel]] = {"instances": InstanceConfig, "preloads": PreloadConfig}
NAMED: dict[str, type[BaseModel]] = {"models": ModelConfig, "relays": RelayConfig}
NESTED: dict[tuple[type[BaseModel], str], type[BaseModel]] = {
    (ModelConfig, "keepalive"): KeepaliveOverride
}
# pydantic-settings' own init options and keys YAML reads as something other than a string.
TRICKY_KEYS = ["_env_file", "_env_prefix", "_case_sensitive", "_secrets_dir", "__pydantic_self__"]

DURATIONS = st.sampled_from(
    ["5s", "250ms", "2m", "1h", "1.5", "0", "bogus", "-1s", "1 day", "1e400", "9" * 400 + "s"]
)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["gpu-a", "gpu-b", "m", "-bad", "a b", ""]),
    "url": st.sampled_from(["http://127.0.0.1:8000", "https://h/v1/", "ftp://x", "http://", "x"]),
    "cron": st.sampled_from(
        ["0 8 * * *", "*/10 * * * * *", "61 * * * *", "0 0 31 2 *", "* * *", "", "bogus"]
    ),
    "timezone": st.sampled_from(["UTC", "Europe/Paris", "Nope/Nowhere", "", "\x00", "../etc"]),
    "kind": st.sampled_from(["llama-swap", "ollama", "openai", "swap-on-request", "tgi"]),
    "path": st.sampled_from(["/metrics", "metrics", "/"]),
    "models": st.lists(st.sampled_from(["m", "n", ""]), max_size=3),
    "aliases": st.lists(st.sampled_from(["m", "n", "m2"]), max_size=3),
    "upstream_names": st.dictionaries(st.sampled_from(["gpu-a", "zz"]), st.just("up")),
}
WILD = st.one_of(
    SCALARS,
    DURATIONS,
    st.sampled_from([10**400, math.inf, -math.inf, math.nan, "off", "on", "yes", 0, -1, 65536]),
    JSON,
)


def value_for(field: str, model: type[BaseModel]) -> st.SearchStrategy[Any]:
    nested = NESTED.get((model, field))
    plausible = entry(nested) if nested else PLAUSIBLE.get(field, DURATIONS)
    return st.one_of(plausible, WILD)


def entry(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """A mapping of some of ``model``'s keys, now and then with an unknown one."""
    optional = {field: value_for(field, model) for field in model.model_fields}
    unknown = st.dictionaries(st.text(max_size=6).filter(lambda k: k not in optional), WILD)
    return st.builds(
        lambda known, extra: {**extra, **known},
        st.fixed_dictionaries({}, optional=optional),
        unknown | st.just({}),
    )


def top_level(key: str) -> st.SearchStrategy[Any]:
    shaped: st.SearchStrategy[Any]
    if key in SECTIONS:
        shaped = entry(SECTIONS[key])
    elif key in LISTS:
        shaped = st.lists(entry(LISTS[key]), max_size=3)
    else:
        shaped = st.dictionaries(st.sampled_from(["m", "n", "cloud", ""]), entry(NAMED[key]))
    return shaped | WILD


CONFIGS = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries({}, optional={key: top_level(key) for key in Settings.model_fields}),
    st.dictionaries(
        st.sampled_from(TRICKY_KEYS) | st.text(max_size=8) | st.integers() | st.none(),
        WILD,
        max_size=2,
    )
    | st.just({}),
)
MINIMAL = {"instances": [{"name": "gpu-a", "url": "http://127.0.0.1:8000"}]}


def test_the_generators_cover_every_section() -> None:
    assert {*SECTIONS, *LISTS, *NAMED} == set(Settings.model_fields)


def settings_or_problems(load: Callable[[], Settings], paths: set[str]) -> Settings | list[str]:
    """What ``load`` returned, or the problems of its ConfigError, each starting with a path."""
    try:
        loaded = load()
    except ConfigError as exc:
        failure = exc
    else:
        assert isinstance(loaded, Settings)
        assert loaded.instances
        assert all(math.isfinite(number) for number in _numbers(loaded.model_dump()))
        return loaded
    assert failure.problems
    assert str(failure).startswith("invalid configuration:")
    for problem in failure.problems:
        assert isinstance(problem, str)
        assert problem.startswith(tuple(paths)), problem
        assert problem in str(failure)
    return failure.problems


def _numbers(value: object) -> Iterator[float]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, float):
        yield value


@BOUNDED
@given(CONFIGS)
@example({1: "x", **MINIMAL})
@example({None: 1, **MINIMAL})
@example({"_env_prefix": 5, **MINIMAL})
@example({"__pydantic_self__": 1, **MINIMAL})
@example({"_env_file": "/etc/passwd", **MINIMAL})
def test_any_mapping_is_settings_or_a_config_error(data: dict[Any, Any]) -> None:
    paths = {"(top level)", *Settings.model_fields, *map(str, data)}
    outcome = settings_or_problems(lambda: parse_config(data), paths)
    for key in data:
        if key not in Settings.model_fields:
            assert isinstance(outcome, list)
            assert (
                f"{key}: unknown key; check its spelling against the documented schema" in outcome
            )


# A valid config, to which one key at a time is set to anything: a problem must be at that key.
BASE = {
    "instances": [{"name": "gpu-a", "url": "http://127.0.0.1:8000"}],
    "models": {"m": {"aliases": ["m2"], "relay": "cloud", "keepalive": {"interval": "2s"}}},
    "relays": {"cloud": {"url": "https://relay.example"}},
    "preloads": [{"name": "morning", "model": "m", "cron": "0 8 * * *"}],
}
WHERE: dict[str, tuple[str | int, ...]] = {
    **{key: (key,) for key in SECTIONS},
    "instances": ("instances", 0),
    "preloads": ("preloads", 0),
    "models": ("models", "m"),
    "relays": ("relays", "cloud"),
}
KEY_PATHS: list[tuple[str | int, ...]] = [
    *[(key,) for key in [*Settings.model_fields, "bogus", *TRICKY_KEYS]],
    *[
        (*WHERE[key], field)
        for key, model in {**SECTIONS, **LISTS, **NAMED}.items()
        for field in [*model.model_fields, "bogus"]
    ],
    *[("models", "m", "keepalive", field) for field in KeepaliveOverride.model_fields],
]
# What else a key's value can break: the names others refer to.
REFERRED_FROM = {"relays": "models.m.relay"}


def yaml_path(parts: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")


def overridden(parts: tuple[str | int, ...], value: object) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    node: Any = data
    for part in parts[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[parts[-1]] = value
    return data


def value_at(parts: tuple[str | int, ...]) -> st.SearchStrategy[Any]:
    field = parts[-1]
    if len(parts) == 1:
        return top_level(field) if field in Settings.model_fields else WILD
    model = {**SECTIONS, **LISTS, **NAMED}.get(str(parts[0]), KeepaliveOverride)
    return value_for(str(field), KeepaliveOverride if len(parts) == 4 else model)


@BOUNDED
@given(st.sampled_from(KEY_PATHS).flatmap(lambda p: st.tuples(st.just(p), value_at(p))))
@example((("server", "idle_timeout"), math.inf))
@example((("routing", "max_wait"), 10**400))
@example((("keepalive", "interval"), "9" * 400 + "s"))
@example((("routing", "demand_horizon"), math.inf))
@example((("instances", 0, "weight"), math.inf))
@example((("preloads", 0, "timezone"), "\x00"))
def test_a_bad_value_is_reported_at_its_own_path(case: tuple[tuple[str | int, ...], Any]) -> None:
    parts, value = case
    where = [yaml_path(parts), *[REFERRED_FROM[key] for key in parts[:1] if key in REFERRED_FROM]]
    outcome = settings_or_problems(
        lambda: parse_config(overridden(parts, value)), {*where, str(parts[0])}
    )
    if isinstance(outcome, list):
        for problem in outcome:
            at = problem.split(": ", 1)[0]
            assert any(at.startswith(w) or w.startswith(at) for w in where), (where, problem)


YAML_PIECES = [
    "instances:",
    "server:",
    "models:",
    "preloads:",
    "- ",
    "name: a",
    "url: 'http://x'",
    "a: ",
    "port: ",
    "\n",
    "  ",
    "? ",
    ": ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "<<: ",
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!timestamp ",
    "!!binary ",
    "!!str ",
    "!!set ",
    "!!omap ",
    "!!python/name:os.system ",
    "2001-13-01",
    "2001-01-01t",
    "0000-01-01",
    "0x",
    "0o9",
    "-",
    ".",
    "x",
    "1" * 5000,
    ".inf",
    ".nan",
    "off",
    "~",
    "'",
    '"',
    "\\",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "#",
    "|\n",
    ">\n",
    "\t",
    "\x00",
    "\ufeff",
    "\ud800",
    "1:2:x",
    "190:20:30",
    "5s",
    "* * * * *",
]
YAML_SOUP = st.lists(st.sampled_from(YAML_PIECES), max_size=30).map("".join)
FILES = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=100).map(lambda text: text.encode("utf-8", "surrogatepass")),
    YAML_SOUP.map(lambda text: text.encode("utf-8", "surrogatepass")),
    CONFIGS.map(lambda data: yaml.safe_dump(data).encode()),
    st.integers(1, 700).map(lambda n: b"instances: " + b"[" * n + b"]" * n),
)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("properties") / "config.yaml"


@BOUNDED
@given(content=FILES)
@example(content=b"\xff\xfe")
@example(content=b"instances: " + b"[" * 1_000 + b"]" * 1_000)
@example(content=b"1: 2\n")
@example(content=b"a: 2001-13-01\n")
@example(content=b"a: !!bool x\n")
@example(content=b"a: !!timestamp x\n")
@example(content=b"a: !!int '-'\n")
@example(content=b"a: !!float x\n")
@example(content=b"routing: {max_wait: " + b"9" * 400 + b"}\n")
@example(content=b"server: {idle_timeout: .inf}\ninstances: [{name: a, url: 'http://x'}]\n")
def test_any_file_is_settings_or_a_config_error(config_file: Path, content: bytes) -> None:
    config_file.write_bytes(content)
    paths = {str(config_file), "(top level)", *Settings.model_fields, *_top_keys(config_file)}
    settings_or_problems(lambda: load_config(config_file), paths)


def _top_keys(path: Path) -> list[str]:
    """The file's top-level keys as YAML reads them, when it does, to tell unknown ones apart."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # whatever PyYAML raises here, load_config must have said so itself
        return []
    return [str(key) for key in data] if isinstance(data, dict) else []
