"""The simulator's other APIs, in-process, through the real openai and anthropic SDKs.

Responses, Anthropic Messages (only with that protocol), chat tools and usage, rerank, images,
speech and transcriptions: each loads its model before a header, like chat.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import struct
import time
import tracemalloc
import wave
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.types import Message

from swapgate.sim import apis
from swapgate.sim.app import SimServer
from swapgate.sim.backend import PROTOCOLS, SimConfig
from swapgate.tools.cli import main

FAST: dict[str, Any] = {"load_time": 0.0, "ttft": 0.0, "token_rate": 10_000.0, "max_tokens": 6}
TEXT = "Hello from a. Tokens flow"  # six tokens of model "a"
BOTH = ("openai", "anthropic")
WEATHER: openai.types.chat.ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "weather", "parameters": {}},
}
LOOKUP: anthropic.types.ToolParam = {"name": "lookup", "input_schema": {"type": "object"}}
BOUNDARY = "simboundary"


def server(**overrides: Any) -> SimServer:
    return SimServer(SimConfig(**{**FAST, **overrides}))


def app(sim: SimServer) -> Starlette:
    return Starlette(routes=sim.routes())


def raw(sim: SimServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app(sim)), base_url="http://sim")


def _sdk_http(sim: SimServer) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app(sim)))


def openai_client(sim: SimServer, key: str = "sim") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://sim/v1", api_key=key, http_client=_sdk_http(sim))


def anthropic_client(
    sim: SimServer, api_key: str | None = "sim", auth_token: str | None = None
) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url="http://sim", api_key=api_key, auth_token=auth_token, http_client=_sdk_http(sim)
    )


def events(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each SSE event."""
    parsed = []
    for block in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        parsed.append((lines.get("event"), json.loads(lines["data"])))
    return parsed


def form(fields: dict[str, str], upload: bytes | None = None) -> bytes:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    if upload is not None:
        head = 'Content-Disposition: form-data; name="file"; filename="clip.wav"\r\n\r\n'
        parts.append(f"--{BOUNDARY}\r\n{head}" + upload.decode("latin-1") + "\r\n")
    return ("".join(parts) + f"--{BOUNDARY}--\r\n").encode("latin-1")


FORM_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


# -- every new endpoint goes the chat way: key, body, model, load, answer ----------------------

ENDPOINTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/responses", {"input": "hi"}),
    ("/v1/responses", {"input": "hi", "stream": True}),
    ("/v1/messages", {"max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}),
    (
        "/v1/messages",
        {"max_tokens": 6, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/rerank", {"query": "q", "documents": ["q"]}),
    ("/v1/images/generations", {"prompt": "a cat"}),
    ("/v1/audio/speech", {"input": "hi"}),
    ("/v1/audio/transcriptions", {}),
]


@dataclass
class Exchange:
    """What an ASGI app sent, and what the simulator held when its headers went out."""

    status: int = 0
    body: bytes = b""
    resident_at_start: dict[str, str] = field(default_factory=dict)
    start_after: float = 0.0


async def exchange(
    sim: SimServer,
    path: str,
    body: bytes,
    content_type: str,
    disconnect_after: float | None = None,
    seen: Exchange | None = None,
) -> Exchange:
    """One request straight through ASGI, to see when the headers go out."""
    seen = Exchange() if seen is None else seen
    began, delivered = time.monotonic(), False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(disconnect_after or 0)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            seen.status, seen.start_after = message["status"], time.monotonic() - began
            seen.resident_at_start = dict(sim.backend.resident)
        elif message["type"] == "http.response.body":
            seen.body += message.get("body", b"")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", content_type.encode())],
        "server": ("sim", 80),
        "client": ("test", 1),
    }
    await app(sim)(scope, receive, send)
    return seen


def encoded(path: str, fields: dict[str, Any], model: str = "a") -> tuple[bytes, str]:
    if path.endswith("/transcriptions"):
        return form({"model": model, **fields}, b"RIFF"), FORM_TYPE
    return json.dumps({"model": model, **fields}).encode(), "application/json"


@pytest.mark.parametrize(("path", "fields"), ENDPOINTS)
async def test_a_cold_model_is_loaded_before_any_header(path: str, fields: dict[str, Any]) -> None:
    sim = server(load_time=0.05, protocols=BOTH)
    seen = await exchange(sim, path, *encoded(path, fields))
    assert seen.status == 200
    assert seen.resident_at_start == {"a": "ready"}
    assert seen.start_after >= 0.05
    stats = sim.backend.stats()
    assert (stats["requests"], stats["completed"], stats["loads"]) == (1, 1, {"a": 1})


@pytest.mark.parametrize(("path", "fields"), ENDPOINTS)
async def test_a_client_gone_during_the_load_is_counted_cancelled(
    path: str, fields: dict[str, Any]
) -> None:
    sim = server(load_time=0.3, protocols=BOTH)
    seen = await exchange(sim, path, *encoded(path, fields), disconnect_after=0.02)
    assert seen.status == 499
    assert sim.backend.counters["cancelled"] == 1


@pytest.mark.parametrize(("path", "fields"), ENDPOINTS)
async def test_bad_requests_unknown_models_keys_and_failed_loads(
    path: str, fields: dict[str, Any]
) -> None:
    anthropic_shaped = path.startswith("/v1/messages")
    sim = server(protocols=BOTH, api_key="k", fail_load_rate=1.0)
    async with raw(sim) as client:
        body, content_type = encoded(path, fields)
        good = {"content-type": content_type, "authorization": "Bearer k"}
        refused = await client.post(path, content=body, headers={"content-type": content_type})
        unknown = await client.post(path, content=encoded(path, fields, "z")[0], headers=good)
        no_model = await client.post(path, content=b'{"input": 1', headers=good)
        failed = await client.post(path, content=body, headers=good)
    assert [r.status_code for r in (refused, unknown, no_model, failed)] == [401, 404, 400, 502]
    if anthropic_shaped:
        kinds = [r.json()["error"]["type"] for r in (refused, unknown, no_model, failed)]
        assert kinds == [
            "authentication_error",
            "not_found_error",
            "invalid_request_error",
            "api_error",
        ]
        assert refused.json()["type"] == "error"
    else:
        codes = [r.json()["error"]["code"] for r in (refused, unknown, no_model, failed)]
        assert codes == [
            "invalid_api_key",
            "model_not_found",
            "invalid_request_error",
            "load_failed",
        ]
    assert sim.backend.counters["requests"] == 1  # only the request that reached a load


# -- OpenAI Responses -------------------------------------------------------------------------


async def test_responses_whole_through_the_sdk() -> None:
    async with openai_client(server()) as client:
        answer = await client.responses.create(model="a", input="say hi to me")
        listed = await client.responses.create(
            model="a",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "one two"}]}],
            max_output_tokens=2,
        )
    assert answer.output_text == TEXT
    assert answer.status == "completed"
    assert answer.id.startswith("resp_")
    assert answer.usage is not None
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (4, 6)
    assert answer.usage.total_tokens == 10
    assert listed.output_text == "Hello from"
    assert listed.usage is not None
    assert listed.usage.input_tokens == 2


async def test_responses_stream_typed_events_through_the_sdk() -> None:
    async with openai_client(server()) as client:
        stream = await client.responses.create(model="a", input="hi", stream=True)
        received = [event async for event in stream]
    kinds = [event.type for event in received]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 6,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in received] == list(range(len(received)))
    deltas = [e.delta for e in received if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TEXT
    last = received[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == TEXT


async def test_responses_stream_helper_gives_the_final_response() -> None:
    async with (
        openai_client(server()) as client,
        client.responses.stream(model="a", input="hi") as stream,
    ):
        final = await stream.get_final_response()
    assert final.output_text == TEXT


async def test_responses_stream_wire_names_each_event_and_sends_no_done() -> None:
    async with raw(server()) as client:
        answer = await client.post(
            "/v1/responses", json={"model": "a", "input": "hi", "stream": True}
        )
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert b"[DONE]" not in answer.content
    for name, data in events(answer.content):
        assert name == data["type"]
    delta = next(d for n, d in events(answer.content) if n == "response.output_text.delta")
    assert delta["output_index"] == delta["content_index"] == 0
    assert delta["logprobs"] == []


async def test_a_responses_stream_crashes_midway_like_chat() -> None:
    sim, seen = server(crash_mid_stream_rate=1.0), Exchange()
    body = json.dumps({"model": "a", "input": "hi", "stream": True}).encode()
    with pytest.raises(ClientDisconnect):  # how Starlette passes on the simulated reset
        await exchange(sim, "/v1/responses", body, "application/json", seen=seen)
    assert sim.backend.counters["crashed"] == 1
    kinds = [name for name, _ in events(seen.body)]
    assert kinds.count("response.output_text.delta") == 3  # of six
    assert "response.completed" not in kinds


# -- Anthropic Messages -----------------------------------------------------------------------


async def test_messages_are_not_spoken_without_the_anthropic_protocol() -> None:
    async with raw(server()) as client:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            answer = await client.post(path, json={"model": "a", "messages": []})
            assert answer.status_code == 404


async def test_only_anthropic_drops_the_openai_paths() -> None:
    async with raw(server(protocols=("anthropic",))) as client:
        chat = await client.post("/v1/chat/completions", json={"model": "a", "messages": []})
        messages = await client.post("/v1/messages", json={"model": "a", "messages": []})
    assert (chat.status_code, messages.status_code) == (404, 200)


async def test_messages_create_stream_and_count_tokens_through_the_sdk() -> None:
    turn: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello there sim"}]
    async with anthropic_client(server(protocols=BOTH)) as client:
        whole = await client.messages.create(model="a", max_tokens=6, messages=turn)
        async with client.messages.stream(model="a", max_tokens=6, messages=turn) as stream:
            streamed = await stream.get_final_message()
        counted = await client.messages.count_tokens(model="a", system="be brief", messages=turn)
    for message in (whole, streamed):
        assert [block.type for block in message.content] == ["text"]
        block = message.content[0]
        assert block.type == "text"
        assert block.text == TEXT
        assert message.stop_reason == "end_turn"
        assert message.stop_sequence is None
        assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 6)
        assert message.id.startswith("msg_")
    assert counted.input_tokens == 5


async def test_messages_stream_events_in_anthropic_order() -> None:
    body = {"model": "a", "max_tokens": 2, "stream": True, "messages": [{"role": "user"}]}
    async with raw(server(protocols=BOTH)) as client:
        answer = await client.post("/v1/messages", json=body)
    received = events(answer.content)
    assert [name for name, _ in received] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(name == data["type"] for name, data in received)
    assert received[1][1]["content_block"] == {"type": "text", "text": ""}
    assert received[3][1]["delta"] == {"type": "text_delta", "text": "Hello"}
    assert received[6][1]["delta"]["stop_reason"] == "end_turn"
    assert received[6][1]["usage"] == {"output_tokens": 2}


async def test_messages_call_the_first_tool_then_quote_its_result() -> None:
    ask: list[anthropic.types.MessageParam] = [{"role": "user", "content": "look it up"}]
    async with anthropic_client(server(protocols=BOTH)) as client:
        call = await client.messages.create(model="a", max_tokens=6, messages=ask, tools=[LOOKUP])
        async with client.messages.stream(
            model="a", max_tokens=6, messages=ask, tools=[LOOKUP]
        ) as stream:
            streamed = await stream.get_final_message()
        use = call.content[0]
        assert use.type == "tool_use"
        result: anthropic.types.ToolResultBlockParam = {
            "type": "tool_result",
            "tool_use_id": use.id,
            "content": [{"type": "text", "text": "sunny"}],
        }
        follow_up: list[anthropic.types.MessageParam] = [
            *ask,
            {"role": "assistant", "content": call.content},
            {"role": "user", "content": [result]},
        ]
        quoted = await client.messages.create(
            model="a", max_tokens=6, messages=follow_up, tools=[LOOKUP]
        )
    for message in (call, streamed):
        block = message.content[0]
        assert block.type == "tool_use"
        assert (block.name, block.input) == ("lookup", {"query": "sim"})
        assert block.id.startswith("toolu_")
        assert message.stop_reason == "tool_use"
    text = quoted.content[0]
    assert text.type == "text"
    assert text.text.startswith("The tool said: sunny")
    assert quoted.stop_reason == "end_turn"


async def test_messages_take_the_key_as_x_api_key_or_bearer() -> None:
    sim = server(protocols=BOTH, api_key="k")
    turn: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hi"}]
    for api_key, auth_token in (("k", None), (None, "k")):
        async with anthropic_client(sim, api_key, auth_token) as client:
            answer = await client.messages.create(model="a", max_tokens=1, messages=turn)
            assert answer.content
    async with anthropic_client(sim, api_key="wrong") as client:
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.create(model="a", max_tokens=1, messages=turn)
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.count_tokens(model="a", messages=turn)


# -- chat completions: tools and usage --------------------------------------------------------


async def test_chat_calls_the_first_tool_then_quotes_the_tool_message() -> None:
    ask: list[Any] = [{"role": "user", "content": "weather?"}]
    async with openai_client(server()) as client:
        call = await client.chat.completions.create(model="a", messages=ask, tools=[WEATHER])
        choice = call.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        assert choice.message.tool_calls is not None
        tool_call = choice.message.tool_calls[0]
        assert tool_call.type == "function"
        assert tool_call.id.startswith("call_")
        assert tool_call.function.name == "weather"
        assert json.loads(tool_call.function.arguments) == {"query": "sim"}
        follow_up = [
            *ask,
            call.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tool_call.id, "content": "rain"},
        ]
        quoted = await client.chat.completions.create(
            model="a", messages=follow_up, tools=[WEATHER]
        )
    assert quoted.choices[0].finish_reason == "stop"
    assert quoted.choices[0].message.content == f"The tool said: rain {TEXT}"


async def test_chat_streams_a_tool_call_in_fragments() -> None:
    ask: list[Any] = [{"role": "user", "content": "weather?"}]
    async with openai_client(server()) as client:
        stream = await client.chat.completions.create(
            model="a", messages=ask, tools=[WEATHER], stream=True
        )
        chunks = [chunk async for chunk in stream]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant"
    assert first.tool_calls is not None
    assert first.tool_calls[0].function is not None
    assert (first.tool_calls[0].function.name, first.tool_calls[0].function.arguments) == (
        "weather",
        "",
    )
    arguments = ""
    for chunk in chunks[1:-1]:
        calls = chunk.choices[0].delta.tool_calls
        assert calls is not None
        assert calls[0].function is not None
        arguments += calls[0].function.arguments or ""
    assert json.loads(arguments) == {"query": "sim"}
    assert len(chunks) > 3  # the arguments came in more than one fragment
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_chat_include_usage_adds_one_chunk_before_done() -> None:
    body: dict[str, Any] = {"model": "a", "messages": [], "stream": True}
    async with raw(server()) as client:
        plain = await client.post("/v1/chat/completions", json=body)
        with_usage = await client.post(
            "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}
        )
    assert plain.text.endswith("data: [DONE]\n\n")
    assert with_usage.text.endswith("data: [DONE]\n\n")
    plain_chunks = [json.loads(c[6:]) for c in plain.text.split("\n\n")[:-2]]
    usage_chunks = [json.loads(c[6:]) for c in with_usage.text.split("\n\n")[:-2]]
    assert len(usage_chunks) == len(plain_chunks) + 1
    assert all("usage" not in chunk for chunk in plain_chunks)
    last = usage_chunks[-1]
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 1, "completion_tokens": 6, "total_tokens": 7}


async def test_chat_include_usage_through_the_sdk() -> None:
    async with openai_client(server()) as client:
        stream = await client.chat.completions.create(
            model="a",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT


# -- rerank, images, audio --------------------------------------------------------------------


async def test_rerank_orders_documents_by_shared_words() -> None:
    documents = ["a dog", {"text": "the red cat sat"}, "red cat", "nothing here"]
    body = {"model": "a", "query": "red cat", "documents": documents}
    async with raw(server()) as client:
        answer = (await client.post("/v1/rerank", json=body)).json()
        top = (await client.post("/v1/rerank", json={**body, "top_n": 2})).json()
    results = answer["results"]
    assert [r["index"] for r in results] == [1, 2, 0, 3]
    assert [r["relevance_score"] for r in results] == [1.0, 1.0, 0.0, 0.0]
    assert results[0]["document"] == {"text": "the red cat sat"}
    assert answer["model"] == "a"
    assert answer["usage"]["total_tokens"] == 12
    assert [r["index"] for r in top["results"]] == [1, 2]


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height of a PNG whose chunks and pixels all check out."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, tags, pixels = 8, [], b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        tag, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", png[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(tag + data)
        tags.append(tag)
        pixels += data if tag == b"IDAT" else b""
        at += 12 + length
    assert tags == [b"IHDR", b"IDAT", b"IEND"]
    width, height = struct.unpack(">II", png[16:24])
    assert len(zlib.decompress(pixels)) == height * (1 + 3 * width)
    return width, height


async def test_images_are_small_valid_pngs_through_the_sdk() -> None:
    async with openai_client(server()) as client:
        answer = await client.images.generate(model="a", prompt="a cat", n=2)
    assert answer.data is not None
    assert len(answer.data) == 2
    for image in answer.data:
        assert image.b64_json is not None
        assert png_size(base64.b64decode(image.b64_json)) == (8, 8)


async def test_speech_is_silence_that_grows_with_the_input() -> None:
    async with openai_client(server()) as client:
        short = await client.audio.speech.create(model="a", input="hi", voice="alloy")
        long = await client.audio.speech.create(model="a", input="hi " * 20, voice="alloy")
    assert short.response.headers["content-type"] == "audio/wav"
    lengths = []
    for answer in (short, long):
        with wave.open(io.BytesIO(answer.content)) as audio:
            assert (audio.getnchannels(), audio.getsampwidth()) == (1, 2)
            frames = audio.readframes(audio.getnframes())
            assert set(frames) == {0}
            lengths.append(audio.getnframes())
    assert answer.content[:4] == b"RIFF"
    assert lengths[1] > lengths[0] > 0


async def test_transcriptions_through_the_sdk_whole_text_and_streamed() -> None:
    clip = b"RIFF" + bytes(range(256)) * 40
    async with openai_client(server()) as client:
        whole = await client.audio.transcriptions.create(model="a", file=("clip.wav", clip))
        text = await client.audio.transcriptions.create(
            model="a", file=("clip.wav", clip), response_format="text"
        )
        stream = await client.audio.transcriptions.create(
            model="a", file=("clip.wav", clip), stream=True
        )
        streamed = [event async for event in stream]
    said = f"sim transcript of {len(clip)} bytes"
    assert whole.text == said
    assert text == said
    assert [event.type for event in streamed] == ["transcript.text.delta", "transcript.text.done"]
    done = streamed[-1]
    assert done.type == "transcript.text.done"
    assert done.text == said


async def test_a_transcription_wants_a_model_and_a_file() -> None:
    async with raw(server()) as client:
        headers = {"content-type": FORM_TYPE}
        no_model = await client.post(
            "/v1/audio/transcriptions", content=form({}, b"x"), headers=headers
        )
        no_file = await client.post(
            "/v1/audio/transcriptions", content=form({"model": "a"}), headers=headers
        )
        json_body = await client.post("/v1/audio/transcriptions", json={"model": "a"})
    assert [r.status_code for r in (no_model, no_file, json_body)] == [400, 400, 400]
    assert "'file'" in no_file.json()["error"]["message"]


async def test_a_50_mb_upload_is_hashed_without_being_held_in_memory() -> None:
    size, block = 50 * 2**20, bytes(range(256)) * 4096
    expected = hashlib.sha256()

    async def upload() -> AsyncIterator[bytes]:
        head = 'Content-Disposition: form-data; name="file"; filename="big.wav"\r\n\r\n'
        yield (
            form({"model": "a"})[: -len(f"--{BOUNDARY}--\r\n")] + f"--{BOUNDARY}\r\n{head}".encode()
        )
        for _ in range(size // len(block)):
            expected.update(block)
            yield block
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    async with raw(server()) as client:
        tracemalloc.start()
        try:
            answer = await client.post(
                "/v1/audio/transcriptions", content=upload(), headers={"content-type": FORM_TYPE}
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert answer.status_code == 200
    assert answer.json() == {
        "text": f"sim transcript of {size} bytes",
        "bytes": size,
        "sha256": expected.hexdigest(),
    }
    assert peak < 16 * 2**20


# -- configuration ----------------------------------------------------------------------------


def test_every_protocol_has_its_paths() -> None:
    assert set(PROTOCOLS) == set(apis.PATHS)
    with pytest.raises(ValueError, match="unknown protocol 'grpc'"):
        SimConfig(protocols=("openai", "grpc"))


def test_the_protocols_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[SimConfig] = []
    monkeypatch.setattr("swapgate.sim.run_sim", started.append)
    assert main(["sim", "--protocols", "openai, anthropic"]) == 0
    assert main(["sim"]) == 0
    assert [config.protocols for config in started] == [BOTH, ("openai",)]
    assert main(["sim", "--protocols", "openai,anthorpic"]) == 2
    assert "unknown protocol 'anthorpic'" in capsys.readouterr().err
