"""A Messages request answered by a chat-only upstream: what the proxy sends back."""

from __future__ import annotations

import json

import pytest

from swapgate.errors import BadRequest, UpstreamError
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.proxy.translate.translated import HEADER, Translated

MESSAGES, COUNT = ENDPOINTS["/v1/messages"], ENDPOINTS["/v1/messages/count_tokens"]
ASK = {"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {
    "id": "c1",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1},
}


def answered(translated: Translated, status: int, body: bytes, stream: bool = False) -> bytes:
    headers = translated.answer_headers(status, stream, [(b"content-length", b"99")])
    assert HEADER in headers
    assert (b"content-length", b"99") not in headers, "the translated body has its own length"
    half = len(body) // 2
    return translated.feed(body[:half]) + translated.feed(body[half:]) + translated.close()


def test_the_request_goes_as_chat_under_the_upstreams_name() -> None:
    sent = json.loads(Translated(MESSAGES, ASK, "claude").request("gemma-3"))
    assert sent["model"] == "gemma-3"
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    counting = json.loads(Translated(COUNT, ASK, "claude").request("gemma-3"))
    assert (counting["max_tokens"], counting["stream"]) == (1, False)


def test_a_body_that_cannot_be_carried_is_a_400_before_any_swap() -> None:
    with pytest.raises(BadRequest, match="messages"):
        Translated(MESSAGES, {**ASK, "messages": "hi"}, "claude")


def test_a_json_answer_becomes_a_message_under_the_clients_name() -> None:
    message = json.loads(
        answered(Translated(MESSAGES, ASK, "claude"), 200, json.dumps(CHAT).encode())
    )
    assert message["model"] == "claude"
    assert message["content"] == [{"type": "text", "text": "Hello"}]
    assert message["usage"] == {"input_tokens": 9, "output_tokens": 1}
    counted = json.loads(answered(Translated(COUNT, ASK, "claude"), 200, json.dumps(CHAT).encode()))
    assert counted == {"input_tokens": 9}


def test_an_upstream_error_becomes_anthropics_shape_with_its_status() -> None:
    error = {"error": {"message": "context too long", "type": "invalid_request_error"}}
    body = answered(Translated(MESSAGES, ASK, "claude"), 400, json.dumps(error).encode())
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "context too long"},
    }


@pytest.mark.parametrize("body", [b"<html>oops</html>", b"[1, 2]"])
def test_an_answer_that_is_not_a_chat_object_is_an_upstream_error(body: bytes) -> None:
    with pytest.raises(UpstreamError, match="chat answer"):
        answered(Translated(MESSAGES, ASK, "claude"), 200, body)


def test_a_stream_without_usage_counts_its_chunks_as_output_tokens() -> None:
    chunks = [
        {"id": "c2", "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        for word in ("Hel", "lo", "!")
    ]
    chunks.append({"id": "c2", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    sse = (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )
    events = answered(Translated(MESSAGES, {**ASK, "stream": True}, "claude"), 200, sse, True)
    data = [json.loads(line[6:]) for line in events.split(b"\n") if line.startswith(b"data: ")]
    delta = next(d for d in data if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 3  # llama-cpp-python sends no usage chunk
    assert [d["type"] for d in data][-1] == "message_stop"
