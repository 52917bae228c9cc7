"""``models.M.fallbacks`` in the config: each problem told with its YAML path and its fix."""

from __future__ import annotations

from typing import Any

import pytest

from swapgate.config.loading import parse_config
from swapgate.config.settings import ConfigError


def problems(models: dict[str, Any]) -> list[str]:
    instance = {"name": "x", "url": "http://x", "models": ["a", "b", "c", "d"]}
    try:
        parse_config({"instances": [instance], "models": models})
    except ConfigError as exc:
        return exc.problems
    return []


def test_a_list_of_other_models_is_valid() -> None:
    assert problems({"a": {"fallbacks": ["b", "c"]}, "b": {"fallbacks": ["c"]}}) == []


@pytest.mark.parametrize(
    ("models", "told"),
    [
        ({"a": {"fallbacks": ["zz"]}}, "models.a.fallbacks[0]: no model named 'zz'"),
        ({"a": {"fallbacks": ["a"]}}, "models.a.fallbacks[0]: 'a' names itself"),
        ({"a": {"fallbacks": ["b", "b"]}}, "models.a.fallbacks[1]: 'b' is named twice"),
        (
            {"a": {"fallbacks": ["fast"]}, "b": {"aliases": ["fast"]}},
            "models.a.fallbacks[0]: 'fast' is an alias of 'b'; name the model",
        ),
        (
            {"a": {"fallbacks": ["b"]}, "b": {"fallbacks": ["a"]}},
            "models.a.fallbacks: a loop (a -> b -> a)",
        ),
        (
            {"a": {"fallbacks": ["d", "b"]}, "b": {"fallbacks": ["c"]}, "c": {"fallbacks": ["a"]}},
            "models.a.fallbacks: a loop (a -> b -> c -> a)",
        ),
    ],
)
def test_a_bad_list_is_told_with_its_path(models: dict[str, Any], told: str) -> None:
    found = problems(models)
    assert any(p.startswith(told) for p in found), found
    assert len(found) == 1, found
