"""The params rule (swapgate/config/model_params.py), table-style, in each API shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swapgate.config.model_params import Params, ParamsConfig, by_model, params_for
from swapgate.config.settings import ModelConfig
from swapgate.proxy.endpoints import ENDPOINTS, Endpoint
from swapgate.proxy.request import Request, shape
from swapgate.proxy.translate.translated import Translated


def _rule(**conf: Any) -> Params:
    rule = Params.of(ParamsConfig(**conf))
    assert rule is not None
    return rule


QWEN = _rule(
    set={"temperature": 0.6, "chat_template_kwargs.enable_thinking": False, "n_probs": 2},
    default={"top_k": 20, "max_tokens": 64},
    strip=["reasoning_effort", "logprobs"],
)


@pytest.mark.parametrize(
    ("payload", "changed"),
    [
        # set overrides the client; default fills in; strip removes
        (
            {"model": "m", "temperature": 1.5, "top_k": 5, "reasoning_effort": "high"},
            {
                "model": "m",
                "temperature": 0.6,
                "top_k": 5,
                "chat_template_kwargs": {"enable_thinking": False},
                "n_probs": 2,
                "max_tokens": 64,
            },
        ),
        # a dotted key changes one switch and keeps the client's others
        (
            {"model": "m", "chat_template_kwargs": {"enable_thinking": True, "x": 1}},
            {
                "model": "m",
                "chat_template_kwargs": {"enable_thinking": False, "x": 1},
                "temperature": 0.6,
                "n_probs": 2,
                "top_k": 20,
                "max_tokens": 64,
            },
        ),
        # what is not an object on the way is replaced by one
        (
            {"model": "m", "chat_template_kwargs": "junk", "logprobs": True},
            {
                "model": "m",
                "chat_template_kwargs": {"enable_thinking": False},
                "temperature": 0.6,
                "n_probs": 2,
                "top_k": 20,
                "max_tokens": 64,
            },
        ),
    ],
)
def test_set_default_and_strip(payload: dict[str, Any], changed: dict[str, Any]) -> None:
    assert QWEN.apply(payload) == changed


@pytest.mark.parametrize(
    ("conf", "payload", "changed"),
    [
        ({"default": {"a.b": 1}}, {"a": {"b": 2}}, {"a": {"b": 2}}),
        ({"default": {"a.b": 1}}, {"a": {"c": 2}}, {"a": {"c": 2, "b": 1}}),
        ({"default": {"a": {"x": 1}}, "set": {"a.b": 2}}, {}, {"a": {"x": 1, "b": 2}}),
        ({"strip": ["a.b"]}, {"a": {"b": 1, "c": 2}}, {"a": {"c": 2}}),
        ({"strip": ["a.b"]}, {"a": "text"}, {"a": "text"}),
        ({"strip": ["a"]}, {"b": 1}, {"b": 1}),
        ({"set": {"stop": None}}, {"stop": ["x"]}, {"stop": None}),
    ],
)
def test_nested_paths(conf: dict[str, Any], payload: dict[str, Any], changed: Any) -> None:
    assert _rule(**conf).apply(payload) == changed


def test_the_clients_objects_are_left_whole() -> None:
    kwargs = {"enable_thinking": True}
    payload = {"chat_template_kwargs": kwargs, "logprobs": True}
    _rule(set={"chat_template_kwargs.enable_thinking": False}, strip=["logprobs"]).apply(payload)
    assert payload == {"chat_template_kwargs": {"enable_thinking": True}, "logprobs": True}
    rule = _rule(set={"stop": ["a"]})
    first = rule.apply({})
    first["stop"].append("b")
    assert rule.apply({}) == {"stop": ["a"]}  # each request gets its own copy


def apply_params(request: Request, rule: Params | None, endpoint: Endpoint) -> Any:
    """What the handler does with a request (swapgate/proxy/handler.py, ``_admit``)."""
    found = params_for({"m": rule} if rule else {}, "m", endpoint.label)
    if found is None:
        return None
    request.change(found.apply)
    return found.into_chat(endpoint.protocol)


def _request(payload: dict[str, Any]) -> Request:
    return Request(payload, json.dumps(payload).encode(), payload["model"], False)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_openai_shapes_go_upstream_changed(path: str) -> None:
    request = _request({"model": "m", "input": "hi", "temperature": 1, "logprobs": True})
    assert apply_params(request, QWEN, ENDPOINTS[path]) is not None
    sent = json.loads(request.body)
    assert sent == request.payload
    assert sent["temperature"] == 0.6
    assert "logprobs" not in sent
    assert sent["input"] == "hi"


MESSAGES = {
    "model": "m",
    "max_tokens": 10,
    "temperature": 1.0,
    "messages": [{"role": "user", "content": "hi"}],
    "reasoning_effort": "high",
}
RESPONSES = {"model": "m", "input": "hi", "temperature": 1.0, "reasoning_effort": "high"}


@pytest.mark.parametrize(
    ("path", "payload", "max_tokens"),
    [("/v1/messages", MESSAGES, 10), ("/v1/responses", RESPONSES, 64)],
)
def test_a_translated_request_carries_params_to_chat(
    path: str, payload: dict[str, Any], max_tokens: int
) -> None:
    endpoint = ENDPOINTS[path]
    request = _request(payload)
    into_chat = apply_params(request, QWEN, endpoint)
    # the body in the client's shape (what a capture records, what an upstream that speaks
    # it gets) is changed
    assert request.payload["temperature"] == 0.6
    assert "reasoning_effort" not in request.payload
    chat = json.loads(Translated(endpoint, request.payload, "m", into_chat).request("up"))
    assert chat["temperature"] == 0.6  # through the translation
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}  # given to chat
    assert chat["n_probs"] == 2
    assert chat["top_k"] == 20
    assert "reasoning_effort" not in chat
    assert chat["max_tokens"] == max_tokens


def test_a_key_of_the_clients_api_acts_through_its_translation_only() -> None:
    endpoint = ENDPOINTS["/v1/responses"]
    rule = _rule(set={"max_output_tokens": 7, "user": "ops"})
    request = _request(dict(RESPONSES))
    into_chat = apply_params(request, rule, endpoint)
    chat = json.loads(Translated(endpoint, request.payload, "m", into_chat).request("up"))
    assert request.payload["max_output_tokens"] == 7
    assert chat["max_tokens"] == 7
    assert "max_output_tokens" not in chat
    assert "user" not in chat


def test_no_params_change_nothing() -> None:
    request = _request({"model": "m", "temperature": 1})
    body = request.body
    assert apply_params(request, None, ENDPOINTS["/v1/chat/completions"]) is None
    assert request.body is body


def test_a_count_of_tokens_goes_as_sent() -> None:
    request = _request(dict(MESSAGES))
    assert apply_params(request, QWEN, ENDPOINTS["/v1/messages/count_tokens"]) is None
    assert request.payload == MESSAGES


def test_only_models_with_params_have_a_rule() -> None:
    models = {
        "a": ModelConfig(params=ParamsConfig(set={"seed": 1})),
        "b": ModelConfig(),
        "c": ModelConfig(params=ParamsConfig()),  # empty: nothing to do
    }
    assert set(by_model(models)) == {"a"}


def test_a_fallback_model_gets_its_own_params_from_what_the_client_sent() -> None:
    """The asked model's rule is undone, not stacked: the model that answers shapes the
    client's body as if it had been asked (swapgate/proxy/handler.py, ``shape``)."""
    rules = {
        "small": _rule(set={"temperature": 0.1}, strip=["logprobs"]),
        "large": _rule(default={"temperature": 0.7, "top_k": 40}),
    }
    sent = {"model": "small", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    body = json.dumps(sent).encode()
    request = Request(sent, body, "small", False)
    shape(request, rules, ENDPOINTS["/v1/chat/completions"], "small")
    assert (request.payload["temperature"], "logprobs" in request.payload) == (0.1, False)
    request.rename("large")
    shape(request, rules, ENDPOINTS["/v1/chat/completions"], "large")
    assert json.loads(request.body) == {**sent, "model": "large", "temperature": 0.7, "top_k": 40}
    assert sent["model"] == "small", "the client's body itself is left whole"

    messages = {"model": "small", "max_tokens": 8, "messages": sent["messages"]}
    translated = Request(messages, json.dumps(messages).encode(), "small", False)
    shape(translated, rules, ENDPOINTS["/v1/messages"], "small")
    translated.rename("large")
    shape(translated, rules, ENDPOINTS["/v1/messages"], "large")
    assert translated.translation is not None
    chat = json.loads(translated.translation.request("large-upstream"))
    assert (chat["model"], chat["temperature"], chat["top_k"]) == ("large-upstream", 0.7, 40)
