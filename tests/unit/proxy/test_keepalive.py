from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.config.settings import KeepaliveConfig, KeyConfig
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.load_progress import Figure
from swapgate.data.lease import Progress
from swapgate.errors import SwapFailed
from swapgate.metrics import Metrics
from swapgate.proxy import keepalive
from swapgate.proxy.endpoints import ANTHROPIC, ENDPOINTS, RESPONSES, Dialect, Endpoint
from swapgate.proxy.keepalive import KeepalivePlan, Pinger, plan_keepalive, progress_mode
from swapgate.proxy.writer import BodyMode, ResponseWriter

DEFAULT = KeepaliveConfig()


CHAT, TEXT = ENDPOINTS["/v1/chat/completions"], ENDPOINTS["/v1/completions"]
MESSAGES, SPEECH = ENDPOINTS["/v1/messages"], ENDPOINTS["/v1/audio/speech"]
REASONING = KeepaliveConfig(streaming="reasoning")


@pytest.mark.parametrize(
    ("config", "stream", "endpoint", "opted_out", "kind"),
    [
        (DEFAULT, True, CHAT, False, "comment"),
        (DEFAULT, False, CHAT, False, "whitespace"),
        (DEFAULT, True, CHAT, True, None),
        (REASONING, True, CHAT, False, "reasoning"),
        (REASONING, True, TEXT, False, "comment"),
        (KeepaliveConfig(streaming="off"), True, CHAT, False, None),
        (KeepaliveConfig(streaming="off"), False, CHAT, False, "whitespace"),
        (KeepaliveConfig(non_streaming="off"), False, CHAT, False, None),
        (DEFAULT, True, ENDPOINTS["/v1/responses"], False, "comment"),
        (DEFAULT, True, MESSAGES, False, "ping"),  # Anthropic's own keep-alive event
        (REASONING, True, MESSAGES, False, "ping"),
        (DEFAULT, False, MESSAGES, False, "whitespace"),
        (DEFAULT, False, SPEECH, False, None),  # audio bytes cannot start with a newline
        (DEFAULT, True, SPEECH, False, "comment"),
    ],
)
def test_plan(
    config: KeepaliveConfig, stream: bool, endpoint: Endpoint, opted_out: bool, kind: str | None
) -> None:
    plan = plan_keepalive(config, stream=stream, endpoint=endpoint, opted_out=opted_out)
    assert (plan.kind if plan else None) == kind


def test_per_model_overrides_merge_with_the_global_section() -> None:
    settings = parse_config(
        {
            "instances": [{"name": "x", "url": "http://x"}],
            "keepalive": {"interval": "2s"},
            "models": {"r": {"keepalive": {"streaming": "reasoning"}}},
        }
    )
    assert settings.keepalive_for("r") == KeepaliveConfig(interval=2.0, streaming="reasoning")
    assert settings.keepalive_for("other") == KeepaliveConfig(interval=2.0)


def _pinger(kind: str, state: str = "loading", dialect: Dialect | None = None) -> Pinger:
    settings = parse_config({"instances": [{"name": "gpu-a", "url": "http://x"}]})
    registry = Registry(settings.instances, Catalog(settings))
    registry.swap_marks.begin_swap("gpu-a", "m", eta=27.4)

    async def send(_: object) -> None:
        raise AssertionError("not sent in these tests")

    plan = KeepalivePlan(kind, 1.0, 5.0)  # type: ignore[arg-type]
    writer = ResponseWriter(send, [], dialect) if dialect else ResponseWriter(send, [])
    return Pinger(plan, writer, "m", Progress("gpu-a", state), registry, Metrics())


def test_comment_pings_say_model_instance_eta_and_elapsed() -> None:
    assert _pinger("comment").ping() == b": swapgate loading m on gpu-a, eta 28s, elapsed 0s\n\n"
    queued = _pinger("comment", "queued").ping()
    assert queued.startswith(b": swapgate queued for m on gpu-a, eta ")


def test_anthropic_pings_are_its_ping_event_after_the_same_comment() -> None:
    lines = _pinger("ping", dialect=ANTHROPIC).ping().split(b"\n")
    assert lines[0] == b": swapgate loading m on gpu-a, eta 28s, elapsed 0s"
    assert lines[1:] == [b"event: ping", b'data: {"type": "ping"}', b"", b""]


def test_reasoning_pings_are_chat_chunks() -> None:
    ping = _pinger("reasoning").ping()
    assert ping.startswith(b"data: ")
    assert ping.endswith(b"\n\n")
    chunk = json.loads(ping.removeprefix(b"data: "))
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["model"] == "m"
    assert {"id", "created"} <= chunk.keys()
    assert chunk["choices"][0]["delta"]["reasoning_content"] == "Loading m on gpu-a…\n"


def test_whitespace_pings_and_errors() -> None:
    pinger = _pinger("whitespace")
    assert pinger.ping() == b"\n"
    error = json.loads(asyncio.run(_failed_after_pings("whitespace")))
    assert error["error"]["code"] == "swap_failed"
    event = asyncio.run(_failed_after_pings("pings"))
    assert event.startswith(b'data: {"error": ')
    assert event.endswith(b"\n\n")


def test_errors_after_the_200_take_the_endpoints_dialect() -> None:
    event = asyncio.run(_failed_after_pings("pings", RESPONSES))
    assert event.startswith(b"event: error\ndata: ")
    data = json.loads(event.split(b"data: ", 1)[1])
    assert (data["type"], data["code"], data["message"]) == ("error", "swap_failed", "boom")
    assert data["error"]["code"] == "swap_failed"  # what the openai SDK raises APIError on
    event = asyncio.run(_failed_after_pings("pings", ANTHROPIC))
    assert event.startswith(b"event: error\ndata: ")
    data = json.loads(event.split(b"data: ", 1)[1])
    assert data == {"type": "error", "error": {"type": "overloaded_error", "message": "boom"}}
    body = json.loads(asyncio.run(_failed_after_pings("whitespace", ANTHROPIC)))
    assert body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error"


async def _failed_after_pings(mode: BodyMode, dialect: Dialect | None = None) -> bytes:
    """What a writer that committed with keep-alives of ``mode`` ends with on a failure."""
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    writer = ResponseWriter(send, [], dialect) if dialect else ResponseWriter(send, [])
    await writer.start(200, [], mode)
    await writer.fail(SwapFailed("boom"))
    # after whitespace the error object is left unended: the server cuts the connection, so
    # no SDK takes the 200 for a whole (empty) answer; an event stream ends after its event
    assert sent[-1]["more_body"] is (mode == "whitespace")
    body: bytes = sent[-1]["body"]
    return body


def test_a_wake_is_told_as_waking_not_loading() -> None:
    assert _pinger("comment", "waking").ping().startswith(b": swapgate waking m on gpu-a, eta ")
    chunk = json.loads(_pinger("reasoning", "waking").ping().removeprefix(b"data: "))
    assert chunk["choices"][0]["delta"]["reasoning_content"].startswith("Waking m on gpu-a")


@pytest.mark.parametrize(
    ("dialect", "last"),
    [
        (None, b"data: [DONE]\n\n"),
        (RESPONSES, b'event: response.completed\ndata: {"type":"response.completed"}\n\n'),
        (ANTHROPIC, b'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
    ],
)
def test_a_stream_is_whole_once_its_last_event_is_out(dialect: Dialect | None, last: bytes) -> None:
    async def send(_: object) -> None:
        pass

    async def stream() -> list[bool]:
        writer = ResponseWriter(send, [], dialect) if dialect else ResponseWriter(send, [])
        await writer.start(200, [], "events")
        seen = [writer.answered_in_full]
        await writer.write(b'data: {"delta": "hi"}\n\n')
        seen.append(writer.answered_in_full)
        await writer.write(last[:-2])  # the last event, cut before its end
        seen.append(writer.answered_in_full)
        await writer.write(last)  # whole
        seen.append(writer.answered_in_full)
        await writer.write(b": what the upstream sends after it\n\n")
        seen.append(writer.answered_in_full)
        return seen

    assert asyncio.run(stream()) == [False, False, False, True, True]


def test_a_json_body_mentioning_done_is_whole_only_once_ended() -> None:
    async def send(_: object) -> None:
        pass

    async def body() -> tuple[bool, bool]:
        writer = ResponseWriter(send, [])
        await writer.start(200, [], "body")
        await writer.write(b'{"text": "data: [DONE]\\n\\n"}')
        before = writer.answered_in_full
        await writer.end()
        return before, writer.answered_in_full

    assert asyncio.run(body()) == (False, True)


def _told(chunk: bytes) -> str:
    text: str = json.loads(chunk.removeprefix(b"data: "))["choices"][0]["delta"][
        "reasoning_content"
    ]
    return text


@pytest.mark.parametrize(
    ("header", "key", "model", "told"),
    [
        (None, None, "off", "off"),
        (None, None, "reasoning", "reasoning"),
        (None, "reasoning", "off", "reasoning"),
        (b"off", "reasoning", "reasoning", "off"),
        (b"reasoning", None, "off", "reasoning"),
        (b"nonsense", None, "off", "off"),
    ],
)
def test_a_request_header_over_its_key_over_its_model_says_what_it_is_told(
    header: bytes | None, key: str | None, model: str, told: str
) -> None:
    keyed = KeyConfig(name="k", sha256="0" * 64, progress=key)
    config = KeepaliveConfig(progress=model)
    assert progress_mode(header, keyed, config) == told
    assert progress_mode(None, None, KeepaliveConfig(streaming="reasoning")) == "reasoning"


async def test_progress_lines_come_once_a_tick_at_most_and_only_when_they_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keepalive, "PROGRESS_EVERY", 0.01)  # a second, quicker: ticks count
    sent: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message.get("body"):
            sent.append(message["body"])

    settings = parse_config({"instances": [{"name": "gpu-a", "url": "http://x"}]})
    registry = Registry(settings.instances, Catalog(settings))
    figures = iter(["1.0 of 4.0 GB read"] * 3 + ["2.5 of 4.0 GB read"] * 1000)

    def figure(instance: str, model: str) -> Figure:
        return Figure(0.5, next(figures))

    plan = KeepalivePlan("reasoning", 0.0, 0.05)
    progress = Progress("gpu-a", "loading")
    pinger = Pinger(plan, ResponseWriter(send, []), "m", progress, registry, Metrics(), figure)
    running = asyncio.create_task(pinger.run())
    await asyncio.sleep(0.3)
    running.cancel()
    lines = [_told(c) for c in sent if c.startswith(b"data: ")]
    assert lines == [
        "Loading m on gpu-a: 1.0 of 4.0 GB read\n",
        "Loading m on gpu-a: 2.5 of 4.0 GB read\n",
    ], "only when it changes"
    assert b": swapgate waiting\n\n" in sent, "comments keep it alive between"
    assert _told(pinger.last_words()).startswith("m answers after ")
