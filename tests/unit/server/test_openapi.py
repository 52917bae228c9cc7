"""The OpenAPI document (swapgate/server/openapi.py), built without a running gateway: every
proxied endpoint described, swapgate's errors instead of FastAPI's 422, words where a parameter
takes a few. The running gateway is fuzzed against it in tests/e2e/test_contract.py."""

from __future__ import annotations

from typing import get_args

from swapgate.activity.log import USAGE_BY
from swapgate.config.loading import parse_config
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.server.app import create_app
from swapgate.server.openapi import contract
from swapgate.server.routes.activity import UsageBy


def document() -> dict[str, object]:
    app = create_app(parse_config({"instances": [{"name": "x", "url": "http://x"}]}))
    return contract(app.api)


def test_every_proxied_endpoint_is_described_with_its_dialects_errors() -> None:
    paths = document()["paths"]
    assert isinstance(paths, dict)
    for path, endpoint in ENDPOINTS.items():
        operation = paths[path]["post"]
        error = operation["responses"]["503"]["content"]["application/json"]["schema"]["$ref"]
        wanted = {"anthropic": "AnthropicError", "ollama": "OllamaError"}.get(
            endpoint.protocol, "Error"
        )
        assert error.endswith("/" + wanted), path
        assert "Retry-After" in operation["responses"]["503"]["headers"]
        assert operation["requestBody"]["required"] is True


def test_no_route_documents_422_and_each_documents_400_and_500() -> None:
    paths = document()["paths"]
    assert isinstance(paths, dict)
    for path, item in paths.items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            assert "422" not in codes, (method, path)
            assert {"400", "500"} <= codes, (method, path)
            if path.startswith("/admin/"):
                assert {"401", "403"} <= codes, (method, path)


def test_a_query_parameter_that_may_be_left_out_is_never_null() -> None:
    activity = document()["paths"]["/admin/activity"]["get"]  # type: ignore[index]
    status = next(p for p in activity["parameters"] if p["name"] == "status")
    assert status["schema"]["type"] == "integer"
    assert (status["schema"]["minimum"], status["schema"]["maximum"]) == (100, 599)


def test_the_usage_groupings_are_the_logs_own() -> None:
    assert set(get_args(UsageBy)) == set(USAGE_BY)
