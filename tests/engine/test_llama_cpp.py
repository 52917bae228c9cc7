"""swapgate in front of two real llama-cpp-python servers (``kind: swap-on-request``,
docs/configuration.md; docs/compatibility.md).

Each server serves the same GGUF under two aliases with different ``n_ctx``; it keeps one loaded
and swaps when asked for the other, so every cold request makes the engine really load a model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from testbed.engines import LlamaCppEngine
from testbed.random_gguf import SHAPES
from tests.e2e.processes import Gateway, gateway
from tests.engine.conftest import LlamaServer, llama_server, swap_on_request

pytestmark = pytest.mark.engine
MODELS = {"gemma-a": 2048, "gemma-b": 1024}
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello to Paris."}]
# Gemma's end-of-sequence tokens (<eos>, <end_of_turn>) banned: the answer runs to max_tokens.
ENDLESS = {"1": -100, "106": -100}
QUIET = {"x-swapgate-keepalive": "off"}


@pytest.fixture(scope="module")
def fleet(engine: LlamaCppEngine, tmp_path_factory) -> Iterator[tuple[Gateway, list[LlamaServer]]]:
    root: Path = tmp_path_factory.mktemp("llama")
    with llama_server(engine, root, MODELS) as one, llama_server(engine, root, MODELS) as two:
        config = {
            "routing": {"poll_interval": "1s", "min_residency": 0, "expected_swap": "3s"},
            "keepalive": {"early_headers_after": "200ms", "interval": "500ms"},
            "instances": [
                swap_on_request("llama-1", one, list(MODELS)),
                swap_on_request("llama-2", two, list(MODELS)),
            ],
        }
        with gateway(config) as gw:
            yield gw, [one, two]


def ask(client: openai.OpenAI, model: str, stream: bool) -> tuple[str, str]:
    """The answer's text and the route swapgate took (keep-alives off, so that a cold request
    also gets its final route header rather than ``pending``)."""
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=model, messages=HELLO, max_tokens=12, stream=True, extra_headers=QUIET
        ) as response:
            route = response.headers["x-swapgate-route"]
            chunks = list(response.parse())
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), route
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=HELLO, max_tokens=12, extra_headers=QUIET
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-swapgate-route"]


def test_both_models_answer_real_text_and_warm_models_stay_put(fleet) -> None:
    gw, _ = fleet
    with gw.sdk(timeout=60) as client:
        routes = {model: ask(client, model, stream=False)[1] for model in MODELS}
        assert len(set(routes.values())) == 2  # one model warm on each instance
        for _ in range(3):
            for model in MODELS:
                for stream in (False, True):
                    text, route = ask(client, model, stream)
                    assert text.strip(), f"{model} (stream={stream}) answered no text"
                    assert route == routes[model]
    assert gw.metric("swapgate_swaps_total", result="ok") == 2
    assert gw.metric("swapgate_swap_duration_seconds_count", result="ok") == 2
    assert gw.metric("swapgate_swap_duration_seconds_sum", result="ok") > 0


def test_generated_request_ids_pass_the_engine_and_client_ids_travel_unchanged(fleet) -> None:
    gw, _ = fleet
    body = {"model": "gemma-a", "messages": HELLO, "max_tokens": 2}
    mine = "3f2c9a4e-1b7d-4e8a-9c0f-5d6e7f8a9b0c"
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        generated = client.post("/v1/chat/completions", json=body)
        assert generated.status_code == 200, generated.text
        own = client.post("/v1/chat/completions", json=body, headers={"x-request-id": mine})
        assert own.status_code == 200, own.text
        assert own.headers["x-request-id"] == mine
        # The engine itself says which ids it refuses: a client's non-UUID id is its own choice.
        refused = client.post(
            "/v1/chat/completions", json=body, headers={"x-request-id": "trace-42"}
        )
        assert refused.status_code == 400


def test_what_browsers_and_other_sdks_send_does_not_upset_the_engine(fleet) -> None:
    """Each of these made an engine refuse the request (docs/compatibility.md, "Headers");
    llama-cpp-python itself answers 500 to a body whose content-type is not JSON."""
    gw, _ = fleet
    body = {"model": "gemma-a", "messages": HELLO, "max_tokens": 2}
    headers = {
        "content-type": "text/plain",
        "origin": "https://chat.example",
        "cookie": "session=sk-client",
        "api-key": "sk-client",
        "accept-encoding": "gzip",
    }
    with httpx.Client(base_url=gw.url, timeout=60) as client:
        answer = client.post("/v1/chat/completions", content=json.dumps(body), headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    assert "content-encoding" not in answer.headers


def test_completions_stream_from_the_real_engine(fleet) -> None:
    gw, _ = fleet
    with gw.sdk(timeout=60) as client:
        chunks = list(
            client.completions.create(
                model="gemma-b", prompt="The capital of France is", max_tokens=8, stream=True
            )
        )
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in chunks if c.choices).strip()


def test_models_list_both_aliases(fleet) -> None:
    gw, _ = fleet
    with gw.sdk() as client:
        assert {m.id for m in client.models.list()} >= set(MODELS)


def test_embeddings_come_from_the_real_engine(fleet) -> None:
    gw, _ = fleet
    with gw.sdk(timeout=60) as client:
        first = client.embeddings.create(model="gemma-a", input="hello", encoding_format="float")
        second = client.embeddings.create(model="gemma-a", input="goodbye", encoding_format="float")
    vectors = [_flat(first.data[0].embedding), _flat(second.data[0].embedding)]
    assert all(len(v) >= SHAPES["test"].embedding for v in vectors)  # the model's width
    assert vectors[0] != vectors[1]


def test_a_client_that_disconnects_stops_the_generation(fleet) -> None:
    gw, servers = fleet
    with gw.sdk(timeout=60) as client:
        route = ask(client, "gemma-b", stream=False)[1]  # warm, and know which engine serves it
        server = servers[0] if route == "instance/llama-1" else servers[1]
        finished_before = len(server.generated_counts())
        stream = client.chat.completions.create(
            model="gemma-b", messages=HELLO, max_tokens=900, stream=True, logit_bias=ENDLESS
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
        started = time.monotonic()
        # The engine runs one completion at a time: had it gone on, this would wait for 900 tokens.
        text, _ = ask(client, "gemma-b", stream=False)
        waited = time.monotonic() - started
    assert text.strip()
    counts = server.generated_counts()[finished_before:]
    assert counts, "the engine logged no completion"
    assert counts[0] < 900, f"the engine generated {counts[0]} tokens for a client that left"
    assert waited < 20


def _flat(embedding: object) -> list[float]:
    """llama-cpp-python gives Gemma (no pooling in its GGUF) one vector per token."""
    assert isinstance(embedding, list)
    if embedding and isinstance(embedding[0], list):
        return [x for row in embedding for x in row]
    return [float(x) for x in embedding]


def test_anthropic_messages_reach_the_engine_as_chat_and_come_back_as_messages(fleet) -> None:
    """llama-cpp-python speaks no Messages: the anthropic SDK's requests go to it translated."""
    gw, _ = fleet
    ask: Any = [{"role": "user", "content": "Say hello to Paris."}]
    with anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0, timeout=60) as client:
        raw = client.messages.with_raw_response.create(
            model="gemma-a",
            max_tokens=8,
            system="You are brief.",
            messages=ask,
            extra_headers=QUIET,  # the final headers, not keep-alives committed before them
        )
        with client.messages.stream(model="gemma-b", max_tokens=8, messages=ask) as stream:
            texts = list(stream.text_stream)
            streamed = stream.get_final_message()
        counted = client.messages.count_tokens(
            model="gemma-a", system="You are brief.", messages=ask
        )
    message = raw.parse()
    assert raw.headers["x-swapgate-translated"] == "chat-completions"
    assert message.content[0].type == "text"
    assert message.content[0].text.strip()
    assert message.model == "gemma-a"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 0 < message.usage.output_tokens <= 8
    assert message.usage.input_tokens > 5  # the engine's own count of the templated prompt
    assert "".join(texts).strip()
    assert streamed.stop_reason in ("end_turn", "max_tokens")
    # llama-cpp-python sends no usage in a stream: never 0 input tokens (Claude Code's context
    # accounting), swapgate's estimate instead
    assert streamed.usage.input_tokens > 0
    # count_tokens is a one-token chat of the same prompt: the engine counts it the same
    assert counted.input_tokens == message.usage.input_tokens


def test_responses_reach_the_engine_as_chat_and_come_back_as_responses(fleet) -> None:
    """llama-cpp-python speaks no Responses API: the openai SDK's requests go to it translated,
    streamed and not (Codex's path to a chat-only engine)."""
    gw, _ = fleet
    with openai.OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        raw = client.responses.with_raw_response.create(
            model="gemma-a", input="Say hello to Paris.", max_output_tokens=8, extra_headers=QUIET
        )
        events = list(
            client.responses.create(
                model="gemma-b", input="Say hello to Paris.", max_output_tokens=8, stream=True
            )
        )
    response = raw.parse()
    assert raw.headers["x-swapgate-translated"] == "chat-completions"
    assert response.model == "gemma-a"
    assert response.status in ("completed", "incomplete")
    assert response.output_text.strip()
    assert response.usage is not None
    assert response.usage.input_tokens > 5  # the engine's own count of the templated prompt
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas).strip()
    assert last.response.usage is not None
    assert last.response.usage.input_tokens > 0  # the engine sent none: swapgate's estimate


def test_without_the_translation_the_engine_answers_its_own_404(fleet) -> None:
    """The same engine declared as speaking Responses itself: its 404 comes back, as before."""
    _, servers = fleet
    native = {
        **swap_on_request("llama-1", servers[0], list(MODELS)),
        "protocols": ["openai", "responses"],
    }
    with gateway({"instances": [native]}) as gw:
        body = {"model": "gemma-a", "input": "hello"}
        answer = httpx.post(f"{gw.url}/v1/responses", json=body, headers=QUIET, timeout=60)
    assert answer.status_code == 404  # llama-cpp-python serves no Responses API
