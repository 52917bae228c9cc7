"""Bad input gets a clear OpenAI-shaped error, and the next good request still succeeds."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.processes import Gateway, gateway, instance, simulator

pytestmark = pytest.mark.e2e
GOOD = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
KEY = "client-key-123"


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with simulator(load_time=0.2, api_key="instance-secret") as sim:
        config = {
            "server": {"max_body_bytes": 2048, "api_keys_env": "TEST_CLIENT_KEYS"},
            "instances": [instance("gpu-a", sim, api_key_env="TEST_INSTANCE_KEY")],
            "models": {"a": {"aliases": ["alpha"]}},
        }
        env = {"TEST_CLIENT_KEYS": f"other-key, {KEY}", "TEST_INSTANCE_KEY": "instance-secret"}
        with gateway(config, env) as gateway_process:
            yield gateway_process


def _auth(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


def _post(
    gw: Gateway, content: bytes | None = None, json: object = None, key: str | None = KEY
) -> httpx.Response:
    headers = {**_auth(key), "content-type": "application/json"}
    return httpx.post(
        f"{gw.url}/v1/chat/completions", content=content, json=json, headers=headers, timeout=30
    )


def _assert_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}
    message: str = error["message"]
    return message


def _assert_still_serving(gw: Gateway) -> None:
    response = _post(gw, json=GOOD)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def test_unknown_model_is_404_naming_the_known_models(gw) -> None:
    message = _assert_error(_post(gw, json={**GOOD, "model": "nope"}), 404, "model_not_found")
    assert "'nope'" in message
    assert "a, alpha, b" in message
    _assert_still_serving(gw)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"model": "a", "messages": [', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": []}', "'model'"),
        (b'{"model": 7}', "'model'"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_bodies_are_400_and_harmless(gw, body: bytes, needle: str) -> None:
    message = _assert_error(_post(gw, content=body), 400, "invalid_request_error")
    assert needle in message
    _assert_still_serving(gw)


def test_oversize_body_is_413(gw) -> None:
    huge = {**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}
    message = _assert_error(_post(gw, json=huge), 413, "request_too_large")
    assert "max_body_bytes" in message
    _assert_still_serving(gw)


@pytest.mark.parametrize("key", ["wrong", None])
def test_a_bad_or_missing_client_key_is_401(gw, key: str | None) -> None:
    message = _assert_error(_post(gw, json=GOOD, key=key), 401, "invalid_api_key")
    assert "Bearer" in message
    models = httpx.get(f"{gw.url}/v1/models", headers=_auth(key))
    _assert_error(models, 401, "invalid_api_key")


def test_the_instance_gets_its_own_key_and_aliases_are_rewritten(gw) -> None:
    # The simulator refuses any key but its own: a 200 proves the client's key was replaced.
    response = _post(gw, json={**GOOD, "model": "alpha"})
    assert response.status_code == 200
    assert response.json()["model"] == "a"
    by_x_api_key = httpx.post(
        f"{gw.url}/v1/chat/completions", json=GOOD, headers={"x-api-key": KEY}, timeout=30
    )
    assert by_x_api_key.status_code == 200


def test_unknown_paths_and_methods_answer_in_openai_shape(gw) -> None:
    _assert_error(httpx.get(f"{gw.url}/v1/nothing"), 404, "not_found")
    _assert_error(httpx.get(f"{gw.url}/v1/chat/completions"), 405, "method_not_allowed")


def test_the_only_upstream_unreachable_is_503_saying_it_is_down() -> None:
    """Its refusal takes it down at once and the request is placed again as a cold one; with
    no other instance, placement's answer: it is down, retry later (docs/operations.md,
    "When part of the fleet breaks")."""
    with simulator(load_time=0.1) as sim:
        config = {"instances": [instance("gpu-a", sim)], "routing": {"poll_interval": "1h"}}
        with gateway(config) as gw:
            _assert_still_serving(gw)  # "a" is warm now
            sim.kill()
            response = _post(gw, json=GOOD)
            message = _assert_error(response, 503, "no_capacity")
            assert "gpu-a is down" in message
            assert response.headers["retry-after"]
            # The instance is out of placement until a poll sees it again: no second attempt.
            _assert_error(_post(gw, json=GOOD), 503, "no_capacity")
            assert (
                gw.metric("swapgate_upstream_errors_total", instance="gpu-a", kind="connect") == 1
            )
