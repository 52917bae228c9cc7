"""``models.M.params`` and ``capabilities`` as the config loader checks them."""

from __future__ import annotations

import datetime

import pytest

from swapgate.config.loading import parse_config
from swapgate.config.settings import ConfigError


def _with_model(**conf: object) -> dict[str, object]:
    return {
        "instances": [{"name": "gpu-a", "url": "http://127.0.0.1:8000/"}],
        "models": {"qwen": conf},
    }


def _problems(**conf: object) -> list[str]:
    with pytest.raises(ConfigError) as failure:
        parse_config(_with_model(**conf))
    return failure.value.problems


def test_params_and_capabilities_are_read() -> None:
    settings = parse_config(
        _with_model(
            params={
                "set": {"temperature": 0.6, "chat_template_kwargs.enable_thinking": False},
                "default": {"top_k": 20, "stop": ["</s>"]},
                "strip": ["reasoning_effort", "logprobs"],
            },
            capabilities=["tools", "vision"],
        )
    )
    conf = settings.models["qwen"]
    assert conf.params is not None
    assert conf.params.set == {"temperature": 0.6, "chat_template_kwargs.enable_thinking": False}
    assert conf.params.default["stop"] == ["</s>"]
    assert conf.params.strip == ["reasoning_effort", "logprobs"]
    assert conf.capabilities == ["tools", "vision"]


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"set": {"model": "x"}}, "models.qwen.params.set: 'model': swapgate sets 'model'"),
        ({"default": {"stream": True}}, "models.qwen.params.default: 'stream': swapgate sets"),
        ({"strip": ["stream"]}, "models.qwen.params.strip: 'stream': swapgate sets"),
        ({"strip": ["model.name"]}, "models.qwen.params.strip: 'model.name': swapgate sets"),
        (
            {"set": {"temperature": 0.1}, "strip": ["temperature"]},
            "models.qwen.params: 'temperature' is both given and stripped ('temperature')",
        ),
        (
            {
                "set": {"chat_template_kwargs.enable_thinking": False},
                "strip": ["chat_template_kwargs"],
            },
            "models.qwen.params: 'chat_template_kwargs.enable_thinking' is both given and stripped",
        ),
        (
            {"default": {"top_k": 1}, "strip": ["top_k"]},
            "models.qwen.params: 'top_k' is both given and stripped",
        ),
        (
            {"set": {"top_k": 1}, "default": {"top_k": 2}},
            "models.qwen.params: 'top_k' is in set and default: set always wins",
        ),
        ({"set": ["temperature"]}, "models.qwen.params.set: Input should be a valid dictionary"),
        ({"set": "temperature=0"}, "models.qwen.params.set: Input should be a valid dictionary"),
        ({"strip": "logprobs"}, "models.qwen.params.strip: Input should be a valid list"),
        ({"set": {"a..b": 1}}, "models.qwen.params.set: 'a..b': not a key"),
        ({"set": {"seed": float("nan")}}, "models.qwen.params.set: 'seed': not a JSON value"),
        ({"sets": {"seed": 1}}, "models.qwen.params.sets: unknown key"),
    ],
)
def test_params_that_cannot_apply_are_config_errors(
    params: dict[str, object], problem: str
) -> None:
    problems = _problems(params=params)
    assert any(p.startswith(problem) for p in problems), problems


def test_a_date_is_no_json_value() -> None:
    problems = _problems(params={"default": {"since": datetime.date(2024, 1, 1)}})
    assert problems == [
        "models.qwen.params.default: 'since': not a JSON value; quote it or write a number"
    ]


def test_an_unknown_capability_names_the_known_ones() -> None:
    (problem,) = _problems(capabilities=["tools", "telepathy"])
    assert problem.startswith("models.qwen.capabilities[1]:")
    assert "'vision', 'tools', 'embeddings' or 'reasoning'" in problem
