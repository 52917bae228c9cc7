"""Every failure is an exception in the official SDKs, also after swapgate committed a 200.

A non-streaming request that waited past ``early_headers_after`` got its 200 and whitespace;
when its swap then fails, the error object follows and the connection is cut before the body
ends (docs/operations.md). Before, the openai SDK returned a ``Response`` whose ``id``,
``status`` and ``output`` were all None, and Claude Code said "empty or malformed response".
Every load here fails after 0.8 s; the early headers go out after 0.2 s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Sim, Sim]]:
    """Two instances whose every load fails after 0.8 s: one speaks chat only, one Messages."""
    with (
        simulator(load_time=0.8, fail_load_rate=1.0) as chat_only,
        simulator(
            models=("c",), load_time=0.8, fail_load_rate=1.0, protocols="openai,anthropic"
        ) as claude,
    ):
        yield chat_only, claude


@pytest.fixture
def failing(engines: tuple[Sim, Sim]) -> Iterator[Gateway]:
    """A gateway of its own for each test: a failed swap puts its instance in backoff, where
    the next request would get its 503 at once, before any early 200."""
    chat_only, claude = engines
    config = {
        "keepalive": {"early_headers_after": "200ms", "interval": "100ms"},
        "routing": {"max_wait": "1500ms"},
        "instances": [
            instance("chat-only", chat_only, models=["a"]),
            instance("claude", claude, models=["c"], protocols=["openai", "anthropic"]),
        ],
    }
    with gateway(config) as gw:
        yield gw


Clients = tuple[openai.OpenAI, anthropic.Anthropic]
CASES: dict[str, Callable[[openai.OpenAI, anthropic.Anthropic], Any]] = {
    "openai chat": lambda o, _: o.chat.completions.create(model="a", messages=HELLO),  # type: ignore[arg-type]
    "openai completions": lambda o, _: o.completions.create(model="a", prompt="hi"),
    "openai responses (translated)": lambda o, _: o.responses.create(model="a", input="hi"),
    "openai embeddings": lambda o, _: o.embeddings.create(model="a", input="hello"),
    "anthropic messages (translated)": lambda _, a: a.messages.create(
        model="a",
        max_tokens=8,
        messages=HELLO,  # type: ignore[arg-type]
    ),
    "anthropic messages (native)": lambda _, a: a.messages.create(
        model="c",
        max_tokens=8,
        messages=HELLO,  # type: ignore[arg-type]
    ),
}


def _raised(gw: Gateway, call: Callable[[openai.OpenAI, anthropic.Anthropic], Any]) -> Exception:
    """What ``call`` raises with each SDK pointed at ``gw`` (it must raise an API error)."""
    with (
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0) as chat,
        anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0) as claude,
        pytest.raises((openai.APIError, anthropic.APIError)) as raised,
    ):
        call(chat, claude)
    return raised.value


@pytest.mark.parametrize("case", CASES)
def test_a_swap_that_fails_after_the_early_200_raises_in_the_sdk(failing, case) -> None:
    error = _raised(failing, CASES[case])
    # a connection error: the committed 200 was cut, so no SDK can take it for an answer
    assert isinstance(error, openai.APIConnectionError | anthropic.APIConnectionError)


STREAMS: dict[str, Callable[[openai.OpenAI, anthropic.Anthropic], Any]] = {
    "openai chat": lambda o, _: list(
        o.chat.completions.create(model="a", messages=HELLO, stream=True)  # type: ignore[arg-type]
    ),
    "openai completions": lambda o, _: list(
        o.completions.create(model="a", prompt="hi", stream=True)
    ),
    "openai responses (translated)": lambda o, _: list(
        o.responses.create(model="a", input="hi", stream=True)
    ),
    "anthropic messages (translated)": lambda _, a: list(
        a.messages.create(model="a", max_tokens=8, messages=HELLO, stream=True)  # type: ignore[arg-type]
    ),
    "anthropic messages (native)": lambda _, a: list(
        a.messages.create(model="c", max_tokens=8, messages=HELLO, stream=True)  # type: ignore[arg-type]
    ),
}


@pytest.mark.parametrize("case", STREAMS)
def test_a_stream_whose_swap_fails_after_the_early_200_raises_in_the_sdk(failing, case) -> None:
    """Told in-band, in the endpoint's own dialect: each SDK raises its APIError."""
    error = _raised(failing, STREAMS[case])
    assert not isinstance(error, openai.APIConnectionError | anthropic.APIConnectionError)


def _read_until_cut(answer: httpx.Response) -> bytes:
    received: list[bytes] = []
    with pytest.raises(httpx.RemoteProtocolError):  # the body never ends
        received.extend(answer.iter_raw())
    return b"".join(received)


def test_a_plain_client_still_reads_the_error_object_before_the_cut(failing) -> None:
    body = {"model": "a", "messages": HELLO}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{failing.url}/v1/chat/completions", json=body) as answer,
    ):
        assert answer.status_code == 200  # committed by the keep-alives
        assert answer.headers["x-swapgate-keepalive"] == "whitespace"
        received = _read_until_cut(answer)
    error = json.loads(received)["error"]  # JSON allows the whitespace before it
    assert error["type"] == "swapgate_error"
    assert error["code"] in ("swap_failed", "no_capacity")


def test_the_opt_out_header_keeps_the_real_status(failing) -> None:
    opt_out = {"x-swapgate-keepalive": "off"}
    with (
        openai.OpenAI(
            base_url=f"{failing.url}/v1", api_key="x", max_retries=0, default_headers=opt_out
        ) as client,
        pytest.raises(openai.APIStatusError) as raised,
    ):
        client.chat.completions.create(model="a", messages=HELLO)  # type: ignore[arg-type]
    assert raised.value.status_code == 503
