"""What crosses swapgate in each direction (docs/compatibility.md, "Headers")."""

from __future__ import annotations

import pytest

from swapgate.proxy.headers import DROP_RESPONSE, upstream_headers

REQUEST_ID = "95945d1a-baea-40ac-8000-000000000001"


def forwarded(*client: tuple[str, str], api_key: str | None = None) -> list[tuple[str, str]]:
    raw = [(name.encode(), value.encode()) for name, value in client]
    return upstream_headers(raw, REQUEST_ID, api_key)


@pytest.mark.parametrize(
    "name",
    ["authorization", "x-api-key", "api-key", "cookie", "proxy-authorization"],
)
def test_no_client_credential_travels_upstream(name: str) -> None:
    sent = forwarded((name, "sk-client-secret"), ("user-agent", "openai/1"))
    assert all("sk-client-secret" not in value for _, value in sent)
    assert ("user-agent", "openai/1") in sent


def test_the_instance_gets_its_own_key_and_nothing_else() -> None:
    sent = forwarded(("authorization", "Bearer sk-client"), api_key="sk-instance")
    assert [v for k, v in sent if k == "authorization"] == ["Bearer sk-instance"]


def test_the_body_goes_as_json_whatever_the_client_said() -> None:
    for client in ((), (("content-type", "text/plain"),)):
        sent = forwarded(*client)
        assert [v for k, v in sent if k == "content-type"] == ["application/json"]


def test_one_request_id_the_one_swapgate_answers_with() -> None:
    sent = forwarded(("x-request-id", "client-id"))
    assert [v for k, v in sent if k == "x-request-id"] == [REQUEST_ID]


@pytest.mark.parametrize(
    "name", ["origin", "accept-encoding", "host", "content-length", "x-data-parallel-rank"]
)
def test_headers_an_engine_would_reject_or_misuse_are_dropped(name: str) -> None:
    assert name not in {k for k, _ in forwarded((name, "x"))}


def test_what_swapgate_answers_itself_is_not_taken_from_the_upstream() -> None:
    assert {b"x-request-id", b"x-accel-buffering", b"transfer-encoding"} <= DROP_RESPONSE


def test_an_upstream_that_speaks_messages_gets_the_key_as_x_api_key_too() -> None:
    raw = [(b"x-api-key", b"sk-client"), (b"anthropic-version", b"2023-06-01")]
    sent = upstream_headers(raw, REQUEST_ID, "sk-instance", anthropic=True)
    assert [v for k, v in sent if k == "x-api-key"] == ["sk-instance"]
    assert [v for k, v in sent if k == "authorization"] == ["Bearer sk-instance"]
    assert ("anthropic-version", "2023-06-01") in sent
    assert "x-api-key" not in dict(upstream_headers(raw, REQUEST_ID, "sk-instance"))
