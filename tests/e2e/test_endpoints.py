"""The APIs coding tools speak (docs/compatibility.md), with their own SDKs, behind nginx during
swaps.

nginx gives up after 2 s without a byte; every request here waits for a 5 s swap. One
simulator speaks Anthropic Messages itself; the other only OpenAI's APIs, so a Messages request
to it goes as chat completions and its answer comes back translated.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import psutil
import pytest

from tests.e2e.nginx import nginx
from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
LOAD = 2.5  # past early_headers_after (500 ms): every swap here commits its answer first


class Fleet:
    def __init__(self, gw: Gateway, front: str, sims: dict[str, Sim]) -> None:
        self.gw, self.front, self.sims = gw, front, sims

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.front}/v1", api_key="x", max_retries=0, timeout=30)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.front, api_key="x", max_retries=0, timeout=30)

    def loads(self, sim: str, model: str) -> int:
        count: int = self.sims[sim].stats()["loads"].get(model, 0)
        return count


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with (
        simulator(models=("a", "b"), load_time=LOAD) as plain,
        simulator(models=("c", "d"), load_time=LOAD, protocols="openai,anthropic") as claude,
        simulator(models=("bad",), load_time=1.0, fail_load_rate=1.0) as failing,
        # its own instance: a failed swap puts an instance in backoff, which answers at once
        simulator(models=("worse",), load_time=1.0, fail_load_rate=1.0) as failing_too,
        simulator(models=("q",), load_time=0.1) as quick,
    ):
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "500ms", "interval": "1s"},
            "instances": [
                instance("plain", plain),
                instance("claude", claude, protocols=["openai", "anthropic"]),
                instance("failing", failing),
                instance("failing-too", failing_too),
                instance("quick", quick),
            ],
        }
        with gateway(config) as gw, nginx({"swapgate": gw.url}) as fronts:
            yield Fleet(gw, fronts["swapgate"], {"plain": plain, "claude": claude})


def test_responses_streamed_and_not_through_a_swap(fleet: Fleet) -> None:
    with fleet.openai() as client:
        events = list(client.responses.create(model="a", input="hello", stream=True))
        answer = client.responses.create(model="b", input="hello", max_output_tokens=6)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas).startswith("Hello from a.")
    assert events[-1].type == "response.completed"
    assert answer.output_text == "Hello from b. Tokens flow"
    assert fleet.loads("plain", "a") >= 1
    assert fleet.loads("plain", "b") >= 1


def test_messages_to_an_instance_that_speaks_them(fleet: Fleet) -> None:
    with fleet.anthropic() as client:
        message = client.messages.create(
            model="c", max_tokens=6, messages=[{"role": "user", "content": "hello"}]
        )
        with client.messages.stream(
            model="d", max_tokens=6, messages=[{"role": "user", "content": "hello"}]
        ) as stream:
            streamed = stream.get_final_message()
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("Hello from c.")
    assert streamed.content[0].type == "text"
    assert streamed.content[0].text.startswith("Hello from d.")
    assert fleet.sims["claude"].stats()["loads"] == {"c": 1, "d": 1}


def test_messages_translated_for_an_instance_that_speaks_only_chat(fleet: Fleet) -> None:
    with fleet.anthropic() as client:
        ask = [{"role": "user", "content": "hello"}]
        message = client.messages.with_raw_response.create(
            model="a",
            max_tokens=6,
            system="Be brief.",
            messages=ask,  # type: ignore[arg-type]
        )
        with client.messages.stream(model="b", max_tokens=6, messages=ask) as stream:  # type: ignore[arg-type]
            texts = list(stream.text_stream)
            streamed = stream.get_final_message()
    parsed = message.parse()
    # Committed by keep-alives before the engine answered: no route or translation header yet
    # (the simulator without --protocols anthropic has no /v1/messages: it answered as chat).
    assert message.headers["x-swapgate-keepalive"] == "whitespace"
    assert parsed.content[0].type == "text"
    assert parsed.content[0].text == "Hello from a. Tokens flow"
    assert (parsed.model, parsed.stop_reason) == ("a", "end_turn")
    assert parsed.usage.output_tokens == 6
    assert "".join(texts) == "Hello from b. Tokens flow"
    assert streamed.stop_reason == "end_turn"
    assert streamed.usage.output_tokens == 6


def test_a_tool_use_round_trip_through_translation(fleet: Fleet) -> None:
    tools: Any = [
        {
            "name": "lookup",
            "description": "Look a word up",
            "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
        }
    ]
    ask: Any = [{"role": "user", "content": "look up swap"}]
    with fleet.anthropic() as client:
        call = client.messages.create(model="a", max_tokens=20, tools=tools, messages=ask)
        assert call.stop_reason == "tool_use"
        use = next(block for block in call.content if block.type == "tool_use")
        assert (use.name, use.input) == ("lookup", {"query": "sim"})
        result: Any = [
            *ask,
            {"role": "assistant", "content": call.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}],
            },
        ]
        with client.messages.stream(
            model="a", max_tokens=20, tools=tools, messages=result
        ) as stream:
            final = stream.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text.startswith("The tool said: 42")
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_errors_after_the_200_raise_each_sdks_own_exception(fleet: Fleet) -> None:
    with fleet.openai() as client, pytest.raises(openai.APIError) as responses:
        list(client.responses.create(model="bad", input="hello", stream=True))
    assert "swap" in responses.value.message
    assert not isinstance(responses.value, openai.APIStatusError), "told in-band, after the 200"
    ask: Any = [{"role": "user", "content": "hi"}]
    with fleet.anthropic() as client:
        failing = client.messages.stream(model="worse", max_tokens=5, messages=ask)
        with pytest.raises(anthropic.APIStatusError) as messages, failing as stream:
            stream.get_final_message()
    assert messages.value.status_code == 200, "told in-band, after the 200"
    body: Any = messages.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error"


def test_anthropic_errors_before_the_200_are_in_its_shape(fleet: Fleet) -> None:
    with fleet.anthropic() as client, pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    body: Any = unknown.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "known models" in body["error"]["message"]
    malformed = httpx.post(
        f"{fleet.gw.url}/v1/messages", json={"model": "a", "messages": "hi", "max_tokens": 5}
    )
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"


def test_count_tokens_native_and_translated(fleet: Fleet) -> None:
    ask: Any = [{"role": "user", "content": "one two three"}]
    with fleet.anthropic() as client:
        native = client.messages.count_tokens(model="c", messages=ask)
        translated = client.messages.count_tokens(model="q", messages=ask)
    assert native.input_tokens == 3  # the simulator counts words
    assert translated.input_tokens >= 1  # the chat answer's prompt_tokens


def test_rerank_images_and_speech_are_placed_by_model(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.front, timeout=30) as client:
        rerank = client.post(
            "/v1/rerank", json={"model": "q", "query": "swap", "documents": ["swap models", "x"]}
        )
        images = client.post("/v1/images/generations", json={"model": "q", "prompt": "a cat"})
        speech = client.post("/v1/audio/speech", json={"model": "q", "input": "hi", "voice": "x"})
    assert rerank.status_code == 200
    assert rerank.json()["results"][0]["index"] == 0
    assert images.status_code == 200
    assert images.json()["data"][0]["b64_json"]
    assert speech.status_code == 200
    assert speech.headers["content-type"] == "audio/wav"
    assert speech.content.startswith(b"RIFF"), "no keep-alive byte before audio"
    metrics = fleet.gw.metrics()
    for endpoint in ("rerank", "images", "speech"):
        assert f'swapgate_endpoint_requests_total{{endpoint="{endpoint}",status="200"}}' in metrics


def test_a_50_mb_transcription_streams_through_the_gateway(fleet: Fleet) -> None:
    with fleet.openai() as client:
        small = client.audio.transcriptions.create(model="q", file=("a.wav", b"RIFF" * 1000))
    assert small.text == "sim transcript of 4000 bytes"

    chunk = os.urandom(1 << 20)
    size = 50 * len(chunk)
    boundary = "swapgate-upload-test"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nq\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    digest = hashlib.sha256()
    for _ in range(50):
        digest.update(chunk)

    def body() -> Iterator[bytes]:
        yield head
        for _ in range(50):
            yield chunk
        yield tail

    gateway_process = psutil.Process(fleet.gw.process.pid)
    before = gateway_process.memory_info().rss
    answer = httpx.post(
        f"{fleet.gw.url}/v1/audio/transcriptions",
        content=body(),
        headers={
            "content-type": f"multipart/form-data; boundary={boundary}",
            "content-length": str(len(head) + size + len(tail)),
        },
        timeout=60,
    )
    grown = gateway_process.memory_info().rss - before
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == size
    assert answer.json()["sha256"] == digest.hexdigest(), "forwarded unchanged"
    assert grown < 10 * 2**20, f"the gateway grew by {grown >> 20} MiB"
    wait_for(lambda: "transcriptions" in fleet.gw.metrics())
