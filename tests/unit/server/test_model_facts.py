"""What /v1/models says of a model: context, capabilities (swapgate/server/model_facts.py)."""

from __future__ import annotations

from typing import Any

import pytest

from swapgate.config.settings import ModelConfig
from swapgate.server.model_facts import Facts, declared, from_listing, from_props

# What llama-server b6xxx answers on /props (the keys read, and some around them)
PROPS = {
    "default_generation_settings": {"n_ctx": 1024, "params": {}},
    "total_slots": 1,
    "modalities": {"vision": True, "audio": False},
    "chat_template_caps": {"supports_tools": True, "supports_tool_calls": True},
}


@pytest.mark.parametrize(
    ("props", "facts"),
    [
        (PROPS, Facts(1024, frozenset({"vision", "tools"}))),
        ({"n_ctx": 4096, "modalities": {"vision": False}}, Facts(4096)),
        ({"default_generation_settings": {"n_ctx": 0}, "n_ctx": 512}, Facts(512)),
        ({"default_generation_settings": "x", "modalities": [], "chat_template_caps": 1}, Facts()),
        ({"n_ctx": True}, Facts()),
        ([], Facts()),
    ],
)
def test_props(props: Any, facts: Facts) -> None:
    assert from_props(props) == facts


@pytest.mark.parametrize(
    ("listing", "facts"),
    [
        ({"data": [{"id": "a", "max_model_len": 8192}, {"id": "b"}]}, Facts(8192)),
        ({"data": [{"id": "b", "meta": {"n_ctx": 2048, "n_ctx_train": 32768}}]}, Facts()),
        ({"data": [{"id": "a", "meta": {"n_ctx": 2048, "n_ctx_train": 32768}}]}, Facts(2048)),
        ({"data": "none"}, Facts()),
        ("junk", Facts()),
    ],
)
def test_listing(listing: Any, facts: Facts) -> None:
    assert from_listing(listing, "a") == facts


def test_the_config_gives_context_and_capabilities() -> None:
    models = {
        "a": ModelConfig(context=8192, capabilities=["tools", "reasoning"]),
        "b": ModelConfig(),
        "c": ModelConfig(capabilities=["embeddings"]),
    }
    found = declared(models, {m: c.context for m, c in models.items() if c.context})
    assert found == {
        "a": Facts(8192, frozenset({"tools", "reasoning"})),
        "c": Facts(None, frozenset({"embeddings"})),
    }
    assert found["a"].fields() == {"context": 8192, "capabilities": ["reasoning", "tools"]}


def test_an_engines_facts_win_and_the_configs_fill_in() -> None:
    engine = Facts(1024, frozenset({"vision"}))
    config = Facts(8192, frozenset({"tools"}))
    assert engine.over(config) == Facts(1024, frozenset({"vision", "tools"}))
    assert Facts().over(config) == config
    assert Facts().fields() == {}
