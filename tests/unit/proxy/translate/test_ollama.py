"""Ollama's requests to OpenAI's and the answers back (swapgate/proxy/translate/ollama.py,
ollama_stream.py), and its dialect's keep-alive and errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swapgate.errors import BadRequest, NoCapacity
from swapgate.proxy.endpoints import ENDPOINTS, OLLAMA_CHAT, OLLAMA_GENERATE
from swapgate.proxy.exchange import Exchange
from swapgate.proxy.translate import ollama
from swapgate.proxy.translate.ollama_stream import OllamaStream
from swapgate.proxy.translate.translated import OllamaTranslated

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def lines(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.split(b"\n") if line]


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def test_a_chat_carries_images_tools_their_results_options_format_and_think() -> None:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is this?", "images": [PNG]},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "look", "arguments": {"at": "it"}}}],
            },
            {"role": "tool", "content": "a cat", "tool_name": "look"},
        ],
        "tools": [{"type": "function", "function": {"name": "look"}}],
        "options": {"temperature": 0.2, "num_predict": 64, "num_ctx": 8192, "mirostat": 1},
        "format": {"type": "object"},
        "think": False,
        "keep_alive": "5m",
    }
    chat = ollama.to_openai("chat", payload, stream=True)
    user = chat["messages"][1]["content"]
    assert user[0] == {"type": "text", "text": "What is this?"}
    assert user[1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    call = chat["messages"][2]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"at": "it"}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": call["id"], "content": "a cat"}
    assert chat["temperature"] == 0.2
    assert chat["max_tokens"] == 64
    assert "num_ctx" not in chat
    assert "mirostat" not in chat
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert chat["stream_options"] == {"include_usage": True}
    assert "keep_alive" not in chat


def test_generate_is_one_turn_and_raw_goes_to_completions() -> None:
    turn = {"model": "m", "prompt": "hi", "system": "Be kind."}
    assert ollama.upstream_path("generate", turn) == ollama.CHAT_PATH
    assert ollama.to_openai("generate", turn, stream=False)["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "hi"},
    ]
    raw = {"model": "m", "prompt": "[INST] hi", "raw": True, "options": {"num_predict": -1}}
    assert ollama.upstream_path("generate", raw) == ollama.COMPLETIONS_PATH
    assert ollama.to_openai("generate", raw, stream=False) == {"prompt": "[INST] hi"}


def test_bad_fields_are_a_400_that_says_what_to_send() -> None:
    with pytest.raises(BadRequest, match="messages"):
        ollama.to_openai("chat", {"messages": "hi"}, stream=False)
    with pytest.raises(BadRequest, match="format"):
        ollama.to_openai("chat", {"messages": [], "format": 3}, stream=False)
    with pytest.raises(BadRequest, match="input"):
        ollama.to_openai("embed", {"input": []}, stream=False)


def test_a_stream_is_ndjson_with_whole_tool_calls_and_a_last_line_that_counts() -> None:
    times = ollama.Times()
    times.send(2.5)
    stream = OllamaStream("chat", "m", times)
    call = {"index": 0, "id": "c1", "function": {"name": "look", "arguments": '{"at"'}}
    more = {"index": 0, "function": {"arguments": ': "it"}'}}
    raw = sse(
        delta(role="assistant", content="Hel"),
        delta(content="lo", reasoning_content="hmm"),
        delta(tool_calls=[call]),
        delta(tool_calls=[more]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}},
    )
    out = b"".join(stream.feed(raw[i : i + 7]) for i in range(0, len(raw), 7)) + stream.close()
    got = lines(out)
    assert [g["message"]["content"] for g in got[:2]] == ["Hel", "lo"]
    assert got[1]["message"]["thinking"] == "hmm"
    assert got[2]["message"]["tool_calls"] == [
        {"function": {"name": "look", "arguments": {"at": "it"}}}
    ]
    last = got[-1]
    assert last["done"] is True
    assert last["done_reason"] == "stop"
    assert (last["prompt_eval_count"], last["eval_count"]) == (7, 5)
    assert last["load_duration"] == 2_500_000_000
    assert not any(g["done"] for g in got[:-1])
    assert stream.done


def test_an_upstream_error_mid_stream_is_the_last_line() -> None:
    stream = OllamaStream("generate", "m", ollama.Times())
    out = stream.feed(sse(delta(content="a"), {"error": {"message": "the engine died"}}))
    got = lines(out)
    assert got[0]["response"] == "a"
    assert got[-1] == {"error": "the engine died"}


def test_a_whole_answer_and_an_error_answer() -> None:
    endpoint = ENDPOINTS["/api/chat"]
    translated = OllamaTranslated(endpoint, {"messages": []}, "m", stream=False)
    body = json.loads(translated.request("upstream-m", waited=1.0))
    assert body["model"] == "upstream-m"
    answer = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    translated.answer_headers(200, False, [])
    translated.feed(json.dumps(answer).encode())
    made = json.loads(translated.close())
    assert made["message"] == {"role": "assistant", "content": "hi"}
    assert made["done_reason"] == "length"
    assert made["load_duration"] == 1_000_000_000
    failed = OllamaTranslated(endpoint, {"messages": []}, "m", stream=False)
    failed.answer_headers(400, False, [])
    failed.feed(b'{"error": {"message": "context too long"}}')
    assert json.loads(failed.close()) == {"error": "context too long"}


def test_embeddings_new_and_old() -> None:
    answer = {"data": [{"embedding": [0.1, 0.2]}, {"embedding": [0.3, 0.4]}], "usage": {}}
    new = ollama.from_embeddings("embed", answer, "m", ollama.Times())
    assert new["embeddings"] == [[0.1, 0.2], [0.3, 0.4]]
    assert ollama.from_embeddings("embeddings", answer, "m", ollama.Times()) == {
        "embedding": [0.1, 0.2]
    }


def test_the_dialects_keepalive_is_an_empty_piece_and_errors_are_its_shape() -> None:
    chat = json.loads(OLLAMA_CHAT.ping("loading m"))
    assert chat["message"] == {"role": "assistant", "content": ""}
    assert chat["done"] is False
    assert json.loads(OLLAMA_GENERATE.ping("loading m"))["response"] == ""
    error = NoCapacity("no instance can serve 'm'")
    assert json.loads(OLLAMA_CHAT.error_body(error)) == {"error": "no instance can serve 'm'"}
    assert OLLAMA_CHAT.error_event(error).endswith(b"}\n")


def test_ollamas_counts_are_read_for_the_activity_log_and_key_limits() -> None:
    exchange = Exchange.__new__(Exchange)
    exchange.tail = b'{"done":true,"prompt_eval_count":12,"eval_count":34}\n'
    assert exchange.usage() == (12, 34)
