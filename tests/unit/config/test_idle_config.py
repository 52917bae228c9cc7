"""The idle unload's keys (docs/configuration.md, "Idle unload: ttl and keep_alive")."""

from __future__ import annotations

import pytest

from swapgate.config.loading import parse_config
from swapgate.config.settings import ConfigError

INSTANCES = [{"name": "gpu", "url": "http://x", "models": ["m"]}]


def test_ttl_reads_a_duration_and_allow_keep_alive_defaults_to_true() -> None:
    settings = parse_config(
        {
            "instances": INSTANCES,
            "models": {"m": {"ttl": "5m"}},
            "auth": {"keys": [{"name": "k", "sha256": "a" * 64, "allow_keep_alive": False}]},
        }
    )
    assert settings.models["m"].ttl == 300.0
    assert settings.models["m"].allow_keep_alive is True
    assert settings.model_settings("other").ttl is None  # unset: routing.ttl's
    assert settings.routing.ttl == 0.0  # whose default is never
    assert settings.auth.keys[0].allow_keep_alive is False


@pytest.mark.parametrize("ttl", ["soon", -5])
def test_a_bad_ttl_is_told_by_its_yaml_path(ttl: object) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"instances": INSTANCES, "models": {"m": {"ttl": ttl}}})
    assert "models.m.ttl" in str(refused.value)


def test_routing_ttl_is_every_models_default_and_a_models_0_is_kept_as_never() -> None:
    settings = parse_config(
        {
            "instances": INSTANCES,
            "routing": {"ttl": "30m"},
            "models": {"m": {"ttl": 0}, "n": {"ttl": "1m"}},
        }
    )
    assert settings.routing.ttl == 1800.0
    assert settings.models["m"].ttl == 0.0
    assert settings.models["n"].ttl == 60.0
