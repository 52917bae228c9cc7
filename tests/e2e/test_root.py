"""The gateway's root: Claude Code sends ``HEAD /`` before its first request, and a person who
opens the URL should learn what this is and where its API, health, metrics and docs are."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e


def test_head_and_get_on_the_root_say_what_the_gateway_is() -> None:
    with simulator() as sim, gateway({"instances": [instance("sim", sim)]}) as gw:
        head = httpx.head(f"{gw.url}/", timeout=10)
        root = httpx.get(f"{gw.url}/", timeout=10)
    assert head.status_code == 200
    assert root.status_code == 200
    about = root.json()
    assert about["name"] == "swapgate"
    assert about["api"].startswith("/v1")
    assert about["health"] == {"alive": "/healthz", "ready": "/readyz"}
    assert about["metrics"] == "/metrics"
    assert "docs/" in about["docs"]
