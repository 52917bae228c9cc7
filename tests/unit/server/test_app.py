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
    assert "a bug of ours" in errors[0].getMessage()
