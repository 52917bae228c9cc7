"""What a request asks of its copy's idle unload (swapgate/policy/idle_timeout.py): Ollama's
keep_alive in the body or x-swapgate-keep-alive (which wins), taken out of the body for every
upstream but Ollama, ignored where allow_keep_alive is false."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swapgate.config.loading import parse_config
from swapgate.config.settings import KeyConfig
from swapgate.data.lease import Lease, Upstream
from swapgate.errors import BadRequest
from swapgate.policy.idle_timeout import RequestedTimeout, RequestedTimeouts, copy_told
from swapgate.proxy.request import Request

CONFIG = {
    "instances": [
        {"name": "gpu", "url": "http://gpu", "models": ["m", "fixed"]},
        {"name": "ol", "kind": "ollama", "url": "http://ol", "models": ["m"]},
    ],
    "models": {"m": {"ttl": "1h"}, "fixed": {"allow_keep_alive": False}},
}
ASKS = RequestedTimeouts(parse_config(CONFIG))
STRICT = KeyConfig(name="strict", sha256="0" * 64, allow_keep_alive=False)


def request(**fields: Any) -> Request:
    payload = {"model": "m", "messages": [], **fields}
    return Request(payload, json.dumps(payload).encode(), "m", False)


def lease(instance: str, kind: str = "instance") -> Lease:
    return Lease(kind, instance, "m", "m", Upstream(f"http://{instance}", None), 0.0)


@pytest.mark.parametrize(
    ("fields", "headers", "asked"),
    [
        ({"keep_alive": "10m"}, [], RequestedTimeout(600.0, True)),
        ({"keep_alive": 0}, [], RequestedTimeout(0.0, True)),
        ({"keep_alive": -1}, [], RequestedTimeout(None, True)),
        ({}, [(b"x-swapgate-keep-alive", b"30s")], RequestedTimeout(30.0, False)),
        ({"keep_alive": "10m"}, [(b"x-swapgate-keep-alive", b"0")], RequestedTimeout(0.0, True)),
        ({}, [], None),
    ],
)
def test_keep_alive_is_read_from_the_body_or_the_header_which_wins(
    fields: dict[str, Any], headers: list[tuple[bytes, bytes]], asked: RequestedTimeout | None
) -> None:
    sent = request(**fields)
    assert ASKS.read(headers, sent, "m", None) == asked
    assert "keep_alive" not in sent.payload
    assert "keep_alive" not in json.loads(sent.body)
    assert json.loads(sent.body)["model"] == "m"


def test_a_model_or_key_with_allow_keep_alive_false_ignores_it_and_it_goes_nowhere() -> None:
    header = [(b"x-swapgate-keep-alive", b"0")]
    fixed = request(keep_alive=0)
    assert ASKS.read(header, fixed, "fixed", None) is None
    assert "keep_alive" not in json.loads(fixed.body)
    assert ASKS.read(header, request(keep_alive=0), "m", STRICT) is None
    assert ASKS.read([(b"x-swapgate-keep-alive", b"soon")], request(), "fixed", None) is None


@pytest.mark.parametrize(
    ("fields", "headers", "said"),
    [
        ({"keep_alive": "soon"}, [], "keep_alive: not a duration: 'soon'"),
        ({}, [(b"x-swapgate-keep-alive", b"5 min")], "x-swapgate-keep-alive: not a duration"),
        ({"keep_alive": True}, [], "keep_alive: not a duration: True"),
    ],
)
def test_a_keep_alive_that_is_no_duration_is_a_400_saying_what_to_send(
    fields: dict[str, Any], headers: list[tuple[bytes, bytes]], said: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        ASKS.read(headers, request(**fields), "m", None)
    assert said in str(refused.value)
    assert '"5m"' in str(refused.value)
    assert "-1 (keep it)" in str(refused.value)


def test_only_an_ollama_instance_gets_the_keep_alive_the_body_carried() -> None:
    body = json.dumps({"model": "m"}).encode()
    asked = RequestedTimeout(600.0, True)
    assert json.loads(ASKS.body_for(body, lease("ol"), asked))["keep_alive"] == 600.0
    assert (
        json.loads(ASKS.body_for(body, lease("ol"), RequestedTimeout(None, True)))["keep_alive"]
        == -1
    )
    assert ASKS.body_for(body, lease("gpu"), asked) == body
    assert ASKS.body_for(body, lease("ol", kind="relay"), asked) == body
    assert (
        ASKS.body_for(body, lease("ol"), RequestedTimeout(600.0, False)) == body
    )  # a header's: not added
    assert ASKS.body_for(body, lease("ol"), None) == body


def test_a_served_request_that_asked_tells_the_copy_that_served_it() -> None:
    assert copy_told(RequestedTimeout(None, True), lease("gpu")) == ("gpu", "m", None)
    assert copy_told(RequestedTimeout(5.0, False), lease("gpu")) == ("gpu", "m", 5.0)
    # a relay has no copy here
    assert copy_told(RequestedTimeout(5.0, False), lease("cloud", kind="relay")) is None
    assert copy_told(None, lease("gpu")) is None  # it asked nothing
    assert copy_told(RequestedTimeout(0.0, True), None) is None  # never leased
