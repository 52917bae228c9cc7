"""Requests FastAPI serves end OpenAI-shaped whatever goes wrong (docs/operations.md)."""

from __future__ import annotations

import logging

import httpx
import pytest

from swapgate.config.loading import parse_config
from swapgate.server.app import create_app


async def test_an_unforeseen_error_is_a_json_500_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(parse_config({"instances": [{"name": "gpu-a", "url": "http://x"}]}))

    def broken() -> set[str]:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(app.runtime.registry, "up_names", broken)
    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.ERROR):
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            response = await client.get("/readyz")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "internal_error"
    assert "a bug of ours" not in response.text
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].exc_info is not None, "with its traceback"
    assert "a bug of ours" in str(errors[0].exc_info[1])
    counted = app.runtime.metrics.registry.get_sample_value(
        "swapgate_internal_errors_total", {"where": "request"}
    )
    assert counted == 1


async def test_a_bad_query_says_which_field_and_never_shows_the_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_ADMIN_TOKEN", "admin")
    config = {
        "instances": [{"name": "gpu-a", "url": "http://x"}],
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "activity": {"path": ":memory:"},
    }
    app = create_app(parse_config(config))
    transport = httpx.ASGITransport(app=app)
    admin = {"authorization": "Bearer admin"}
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.get("/admin/activity?status=null", headers=admin)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "query.status" in message
    assert "'null'" in message
    assert ".py" not in message
    assert "line" not in message


async def test_a_method_not_allowed_says_which_are_in_allow() -> None:
    app = create_app(parse_config({"instances": [{"name": "gpu-a", "url": "http://x"}]}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.delete("/v1/models")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET"
    assert response.json()["error"]["code"] == "method_not_allowed"
