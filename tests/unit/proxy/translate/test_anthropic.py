"""Anthropic Messages <-> chat completions: each carried and dropped field a row, the stream
byte-boundary proof, and the real anthropic SDK reading what the translator writes."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swapgate.errors import BadRequest
from swapgate.proxy.translate.anthropic import (
    DROPPED,
    RAW_ARGUMENTS,
    count_answer,
    count_request,
    error_body,
    error_from_chat,
    error_type,
    from_chat,
    to_chat,
)
from swapgate.proxy.translate.anthropic_stream import StreamTranslator

MODEL = "local-model"
HELLO: list[MessageParam] = [{"role": "user", "content": "hi"}]
BASE = {"model": MODEL, "max_tokens": 64, "messages": HELLO}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def chat_of(**fields: Any) -> dict[str, Any]:
    return to_chat({**BASE, **fields})


# --- to_chat: top-level fields ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"model": MODEL, "max_tokens": 64, "messages": HELLO}),
        ({"system": "be brief"}, {"messages": [{"role": "system", "content": "be brief"}, *HELLO]}),
        (
            {"system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"messages": [{"role": "system", "content": "a\nb"}, *HELLO]},
        ),
        ({"system": ""}, {"messages": HELLO}),
        ({"stop_sequences": ["\n\nHuman:"]}, {"stop": ["\n\nHuman:"]}),
        ({"temperature": 0.2}, {"temperature": 0.2}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"top_k": 40}, {"top_k": 40}),
        ({"metadata": {"user_id": "u-1"}}, {"user": "u-1"}),
        ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    ],
)
def test_a_carried_field_reaches_chat(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    chat = chat_of(**fields)
    assert {name: chat.get(name) for name in expected} == expected


@pytest.mark.parametrize("fields", [{"stream": False}, {"metadata": {}}, {"metadata": "x"}])
def test_a_field_with_nothing_to_carry_adds_nothing(fields: dict[str, Any]) -> None:
    assert chat_of(**fields) == chat_of()


@pytest.mark.parametrize("field", [*DROPPED, "some_future_field"])
def test_a_dropped_field_changes_nothing(field: str) -> None:
    assert chat_of(**{field: {"type": "enabled", "budget_tokens": 1024}}) == chat_of()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("stay formal", "stay formal"),
        ([{"type": "text", "text": "stay"}, {"type": "text", "text": "formal"}], "stay\nformal"),
    ],
)
def test_a_system_message_in_the_conversation_stays_in_place(content: Any, expected: str) -> None:
    messages = [*HELLO, {"role": "system", "content": content}, *HELLO]
    chat = to_chat({**BASE, "messages": messages})["messages"]
    assert chat == [*HELLO, {"role": "system", "content": expected}, *HELLO]


def test_cache_control_and_citations_are_dropped_inside_blocks() -> None:
    block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}, "citations": []}
    chat = to_chat({**BASE, "messages": [{"role": "user", "content": [block]}]})
    assert chat["messages"] == HELLO


# --- to_chat: content ------------------------------------------------------------------------


def user(*blocks: Any) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = to_chat(
        {**BASE, "messages": [{"role": "user", "content": list(blocks)}]}
    )["messages"]
    return chat


def assistant(*blocks: Any) -> list[dict[str, Any]]:
    messages = [*HELLO, {"role": "assistant", "content": list(blocks)}]
    chat: list[dict[str, Any]] = to_chat({**BASE, "messages": messages})["messages"]
    return chat[1:]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def result(content: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "toolu_1", "content": content}


def use(**fields: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}, **fields}


PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
DATA_URL = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
URL = {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}


@pytest.mark.parametrize(
    ("blocks", "content"),
    [
        ([text("a")], "a"),
        ([text("a"), text("b")], "a\nb"),
        (
            [text("look"), {"type": "image", "source": PNG}],
            [{"type": "text", "text": "look"}, DATA_URL],
        ),
        (
            [{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}],
            [URL],
        ),
        ([text("a"), {"type": "document", "source": {"type": "base64"}}], "a"),
        ([{"type": "thinking", "thinking": "hm", "signature": "s"}, text("a")], "a"),
        ([], ""),
    ],
)
def test_user_content_blocks(blocks: list[Any], content: Any) -> None:
    assert user(*blocks) == [{"role": "user", "content": content}]


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ([text("a"), text("b")], {"role": "assistant", "content": "a\nb"}),
        (
            [{"type": "thinking", "thinking": "hm", "signature": "s"}, text("a")],
            {"role": "assistant", "content": "a"},
        ),
        ([{"type": "redacted_thinking", "data": "x"}], {"role": "assistant", "content": ""}),
        (
            [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}],
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
        ),
    ],
)
def test_assistant_content_blocks(blocks: list[Any], message: dict[str, Any]) -> None:
    assert assistant(*blocks) == [message]


def test_a_tool_use_then_tool_result_round_trip() -> None:
    messages = [
        {"role": "user", "content": "weather in Oslo and Bergen?"},
        {
            "role": "assistant",
            "content": [
                text("Checking."),
                use(input={"city": "Oslo"}),
                use(id="toolu_2", input={"city": "Bergen"}),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C"},
                text("and be quick"),
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [text("no station"), text("try later")],
                    "is_error": True,
                },
            ],
        },
    ]
    chat = to_chat({**BASE, "messages": messages})["messages"]
    assert chat[1]["content"] == "Checking."
    assert [call["id"] for call in chat[1]["tool_calls"]] == ["toolu_1", "toolu_2"]
    assert chat[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no station\ntry later"},
        {"role": "user", "content": "and be quick"},
    ]


def test_an_image_in_a_tool_result_follows_it_in_a_user_message() -> None:
    screenshot = result([text("the screenshot"), {"type": "image", "source": PNG}])
    assert user(screenshot) == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "the screenshot"},
        {"role": "user", "content": [DATA_URL]},
    ]


@pytest.mark.parametrize(("content", "expected"), [(None, ""), ("", ""), ([], "")])
def test_an_empty_tool_result_is_an_empty_tool_message(content: Any, expected: str) -> None:
    assert user(result(content)) == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": expected}
    ]


# --- to_chat: tools --------------------------------------------------------------------------

TOOL = {"name": "weather", "description": "Weather now", "input_schema": WEATHER}
FUNCTION = {"name": "weather", "description": "Weather now", "parameters": WEATHER}


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ([TOOL], [{"type": "function", "function": FUNCTION}]),
        (
            [{**TOOL, "type": "custom", "cache_control": {"type": "ephemeral"}}],
            [{"type": "function", "function": FUNCTION}],
        ),
        (
            [{"name": "now", "input_schema": {"type": "object"}}],
            [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}],
        ),
        ([], None),
    ],
)
def test_tool_definitions(tools: list[Any], expected: Any) -> None:
    assert chat_of(tools=tools).get("tools") == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "weather"},
            {"tool_choice": {"type": "function", "function": {"name": "weather"}}},
        ),
        (
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    chat = chat_of(tools=[TOOL], tool_choice=choice)
    assert {
        k: v for k, v in chat.items() if k in ("tool_choice", "parallel_tool_calls")
    } == expected


def test_a_tool_choice_without_tools_is_left_out() -> None:
    assert chat_of(tool_choice={"type": "auto"}) == chat_of()


# --- to_chat: malformed input ----------------------------------------------------------------


def turn(role: str, *blocks: Any) -> dict[str, Any]:
    """The request fields of a one-message conversation."""
    return {"messages": [{"role": role, "content": list(blocks)}]}


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"messages": "hi"}, "messages: send a list"),
        ({"messages": None}, "messages: send a list"),
        ({"messages": ["hi"]}, r"messages\[0\]: .*role"),
        ({"messages": [{"content": "hi"}]}, r"messages\[0\]: .*role"),
        ({"messages": [{"role": "tool", "content": "hi"}]}, r"messages\[0\]: .*role"),
        ({"messages": [*HELLO, {"role": "user", "content": 3}]}, r"messages\[1\].content: "),
        (turn("system", {"type": "image", "source": PNG}), r"messages\[0\].content\[0\]: "),
        (turn("user", 3), r"messages\[0\].content\[0\]: .*'type'"),
        (turn("user", {"text": "a"}), r"content\[0\]: .*'type'"),
        (turn("user", {"type": "text"}), r"content\[0\]: send a text block"),
        (turn("user", {"type": "audio"}), r"content\[0\]: a 'audio' block"),
        (turn("user", use()), "'tool_use' block"),
        (turn("assistant", result("x")), "'tool_result' block"),
        (turn("assistant", {"type": "image", "source": PNG}), "'image' block"),
        (turn("assistant", use(input="x")), r"content\[0\].input: .*JSON object"),
        (turn("assistant", use(id=None)), r"content\[0\]: .*'id'"),
        (turn("user", {"type": "image"}), r"content\[0\].source: "),
        (
            turn("user", {"type": "image", "source": {"type": "file", "file_id": "f"}}),
            r"content\[0\].source: ",
        ),
        (turn("user", {"type": "tool_result", "content": "x"}), r"content\[0\].tool_use_id: "),
        (turn("user", result(5)), r"content\[0\].content: "),
        (
            turn("user", result([{"type": "search_result"}])),
            r"content\[0\].content\[0\]: a 'search_result' block",
        ),
        ({"system": 5}, "system: "),
        ({"system": [{"type": "image", "source": PNG}]}, r"system\[0\]: "),
        ({"tools": "weather"}, "tools: "),
        ({"tools": [{"type": "web_search_20250305", "name": "web"}]}, r"tools\[0\]: only custom"),
        ({"tools": [{"name": "weather"}]}, r"tools\[0\]: .*input_schema"),
        ({"tool_choice": "auto"}, "tool_choice: "),
        ({"tool_choice": {"type": "tool"}}, "tool_choice: "),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice: "),
    ],
)
def test_malformed_input_is_a_bad_request_that_says_where(
    fields: dict[str, Any], where: str
) -> None:
    with pytest.raises(BadRequest, match=where):
        chat_of(**fields)


# --- to_chat: any input ----------------------------------------------------------------------

BOUNDED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
KINDS = ["text", "image", "tool_use", "tool_result", "thinking", "document", "server_tool_use"]
SOURCE = st.fixed_dictionaries(
    {"type": st.sampled_from(["base64", "url", "file"])},
    optional={"url": JSON, "data": JSON, "media_type": JSON},
)
INNER_BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(KINDS) | JSON}, optional={"text": JSON, "source": SOURCE | JSON}
)
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(KINDS)},
    optional={
        "text": st.text(max_size=4) | JSON,
        "source": SOURCE | JSON,
        "id": JSON,
        "name": JSON,
        "input": JSON,
        "tool_use_id": st.text(max_size=4) | JSON,
        "is_error": JSON,
        "content": st.lists(INNER_BLOCK, max_size=3) | JSON,
    },
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant"]) | JSON,
        "content": st.lists(BLOCK, max_size=3) | JSON,
    },
)
TOOL_DEFINITION = st.fixed_dictionaries(
    {}, optional={"name": JSON, "input_schema": JSON, "type": JSON, "description": JSON}
)
TOOL_CHOICE = st.fixed_dictionaries(
    {"type": st.sampled_from(["auto", "any", "tool", "none"]) | JSON},
    optional={"name": JSON, "disable_parallel_tool_use": JSON},
)
REQUEST = st.fixed_dictionaries(
    {},
    optional={
        "model": JSON,
        "messages": st.lists(MESSAGE, max_size=3) | JSON,
        "system": st.lists(INNER_BLOCK, max_size=2) | JSON,
        "metadata": JSON,
        "stream": JSON,
        "tools": st.lists(TOOL_DEFINITION, max_size=2) | JSON,
        "tool_choice": TOOL_CHOICE | JSON,
    },
) | st.dictionaries(st.text(max_size=10), JSON)


@BOUNDED
@given(REQUEST)
def test_any_request_translates_to_json_or_is_a_bad_request(request: dict[str, Any]) -> None:
    for translate in (to_chat, count_request):
        try:
            chat = translate(request)
        except BadRequest:
            continue
        json.dumps(chat, allow_nan=False)


@BOUNDED
@given(JSON)
def test_any_answer_translates(answer: Any) -> None:
    json.dumps(from_chat(answer, MODEL))
    json.dumps(count_answer(answer))


@BOUNDED
@given(st.lists(st.binary(max_size=40) | st.sampled_from([b"data: ", b"\n\n", b"[DONE]", b"{"])))
def test_any_bytes_stream_translates(chunks: list[bytes]) -> None:
    translator = StreamTranslator(MODEL)
    out = b"".join(map(translator.feed, chunks)) + translator.close()
    assert out.startswith((b"event: message_start\n", b"event: error\n"))
    assert translator.close() == b""


# --- from_chat -------------------------------------------------------------------------------


def completion(message: dict[str, Any], finish: Any = "stop", **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return {"id": "chatcmpl-9", "object": "chat.completion", "choices": [choice], **extra}


def call(arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "weather", "arguments": arguments},
    }


def test_a_completion_becomes_a_message() -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert from_chat(completion({"content": "Hello!"}, usage=usage), "claude-x") == {
        "id": "msg_chatcmpl-9",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hello!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 11, "output_tokens": 3},
    }


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        ("eos", "end_turn"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(finish: Any, stop_reason: str) -> None:
    assert from_chat(completion({"content": "x"}, finish), MODEL)["stop_reason"] == stop_reason
    assert streamed_stop_reason(finish) == stop_reason


@pytest.mark.parametrize(
    ("finish", "stop_reason"), [("stop", "tool_use"), (None, "tool_use"), ("length", "max_tokens")]
)
def test_tool_calls_ended_with_stop_are_tool_use(finish: Any, stop_reason: str) -> None:
    answer = completion({"content": None, "tool_calls": [call('{"city": "Oslo"}')]}, finish)
    assert from_chat(answer, MODEL)["stop_reason"] == stop_reason


@pytest.mark.parametrize(
    ("arguments", "tool_input"),
    [
        ('{"city": "Oslo"}', {"city": "Oslo"}),
        ("", {}),
        (None, {}),
        ({"city": "Oslo"}, {"city": "Oslo"}),
        ('{"city": "Os', {RAW_ARGUMENTS: '{"city": "Os'}),
        ("[1, 2]", {RAW_ARGUMENTS: "[1, 2]"}),
    ],
)
def test_tool_call_arguments_become_input(arguments: Any, tool_input: dict[str, Any]) -> None:
    message = from_chat(
        completion({"content": "", "tool_calls": [call(arguments)]}, "tool_calls"), MODEL
    )
    assert message["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": tool_input}
    ]


def test_text_comes_before_tool_calls_in_order() -> None:
    answer = completion(
        {"content": "Let me see.", "tool_calls": [call("{}"), call("{}", "call_2")]}
    )
    content = from_chat(answer, MODEL)["content"]
    assert [(block["type"], block.get("id")) for block in content] == [
        ("text", None),
        ("tool_use", "call_1"),
        ("tool_use", "call_2"),
    ]


@pytest.mark.parametrize("answer", [{}, {"choices": []}, {"choices": [{}]}, {"usage": None}])
def test_a_thin_answer_still_makes_a_message(answer: dict[str, Any]) -> None:
    message = from_chat(answer, MODEL)
    assert message["id"].startswith("msg_")
    assert len(message["id"]) > len("msg_")
    assert (message["content"], message["stop_reason"]) == ([], "end_turn")
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 0}


# --- count_tokens and errors -----------------------------------------------------------------


def test_count_request_asks_for_one_token_without_a_stream() -> None:
    chat = count_request({"model": MODEL, "messages": HELLO, "system": "s", "stream": True})
    assert chat == {
        "model": MODEL,
        "messages": [{"role": "system", "content": "s"}, *HELLO],
        "max_tokens": 1,
        "stream": False,
    }


@pytest.mark.parametrize(("answer", "tokens"), [({"usage": {"prompt_tokens": 42}}, 42), ({}, 0)])
def test_count_answer(answer: dict[str, Any], tokens: int) -> None:
    assert count_answer(answer) == {"input_tokens": tokens}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
        (504, "timeout_error"),
        (500, "api_error"),
        (502, "api_error"),
        (422, "invalid_request_error"),
        (409, "invalid_request_error"),
    ],
)
def test_error_type(status: int, kind: str) -> None:
    assert error_type(status) == kind


def test_error_body_is_compact_json() -> None:
    assert error_body(429, "slow down") == (
        b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b'{"error": {"message": "context too long", "type": "invalid_request_error"}}',
            "context too long",
        ),
        (b'{"error": "model not loaded"}', "model not loaded"),
        (b'{"message": "bad things"}', "bad things"),
        (b"upstream fell over\n", "upstream fell over"),
        (b"\xff\xfe", "\ufffd\ufffd"),
        (b"", "the backend answered 400"),
        (b"[1, 2]", "[1, 2]"),
    ],
)
def test_error_from_chat(body: bytes, message: str) -> None:
    assert json.loads(error_from_chat(400, body)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


# --- streaming -------------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: Any = None, **extra: Any) -> dict[str, Any]:
    choices = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return {"id": "chatcmpl-7", "object": "chat.completion.chunk", "choices": choices, **extra}


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {"id": "chatcmpl-7", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def sse(*events: dict[str, Any] | str, newline: bytes = b"\n") -> bytes:
    # Not ASCII-escaped: a split inside a multi-byte character is part of the boundary proof.
    lines = (json.dumps(e, ensure_ascii=False) if isinstance(e, dict) else e for e in events)
    return b"".join(b"data: " + line.encode() + newline * 2 for line in lines)


def translate(body: bytes, step: int | None = None, close: bool = True) -> bytes:
    translator = StreamTranslator("claude-local")
    step = step or max(len(body), 1)
    out = b"".join(translator.feed(body[i : i + step]) for i in range(0, len(body), step))
    return out + (translator.close() if close else b"")


def events(stream: bytes) -> list[dict[str, Any]]:
    """Each Anthropic event, checked to be one ``event:`` and one ``data:`` line that agree."""
    assert stream.endswith(b"\n\n") or not stream
    parsed = []
    for raw in stream.split(b"\n\n")[:-1]:
        name, data = raw.split(b"\n")
        event = json.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + event["type"].encode()
        parsed.append(event)
    return parsed


TEXT_STREAM = sse(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Héllo, "}),
    chunk({"reasoning_content": "thinking it over"}),
    chunk({"content": "wörld ✓ 日本"}),
    chunk({}, "stop"),
    usage_chunk(9, 4),
    "[DONE]",
)


def text_delta(value: str) -> dict[str, str]:
    return {"type": "text_delta", "text": value}


def test_a_text_stream_becomes_anthropic_events() -> None:
    assert events(translate(TEXT_STREAM)) == [
        {
            "type": "message_start",
            "message": {
                "id": "msg_chatcmpl-7",
                "type": "message",
                "role": "assistant",
                "model": "claude-local",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": text_delta("Héllo, ")},
        {"type": "content_block_delta", "index": 0, "delta": text_delta("wörld ✓ 日本")},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"input_tokens": 9, "output_tokens": 4},
        },
        {"type": "message_stop"},
    ]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("step", [1, 2, 3, 7, 64])
def test_any_byte_boundaries_give_the_same_events(newline: bytes, step: int) -> None:
    body = TEXT_STREAM.replace(b"\n", newline)
    assert "日本".encode() in body
    assert translate(body, step) == translate(TEXT_STREAM)


def test_comments_other_fields_and_multiline_data_are_read_as_sse() -> None:
    body = (
        b": keep-alive\n\n"
        b"event: chunk\nid: 1\ndata: " + json.dumps(chunk({"content": "a"})).encode() + b"\n\n"
        b'data: {"id": "chatcmpl-7", "choices": [{"index": 0,\n'
        b'data: "delta": {"content": "b"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    texts = [
        e["delta"]["text"] for e in events(translate(body)) if e["type"] == "content_block_delta"
    ]
    assert texts == ["a", "b"]


def tool_delta(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name:
        function["name"] = name
    entry: dict[str, Any] = {"index": index, "function": function}
    if call_id:
        entry.update(id=call_id, type="function")
    return chunk({"tool_calls": [entry]})


TOOL_STREAM = sse(
    chunk({"role": "assistant", "content": "Checking."}),
    tool_delta(0, "", "call_a", "weather"),
    tool_delta(0, '{"city": '),
    tool_delta(0, '"Oslo"}'),
    tool_delta(1, '{"city": "Bergen"}', "call_b", "weather"),
    chunk({}, "tool_calls"),
    usage_chunk(20, 12),
    "[DONE]",
)


def test_a_tool_call_stream_opens_a_block_per_call() -> None:
    out = events(translate(TOOL_STREAM))
    starts = [(e["index"], e["content_block"]) for e in out if e["type"] == "content_block_start"]
    assert starts == [
        (0, {"type": "text", "text": ""}),
        (1, {"type": "tool_use", "id": "call_a", "name": "weather", "input": {}}),
        (2, {"type": "tool_use", "id": "call_b", "name": "weather", "input": {}}),
    ]
    deltas = [
        (e["index"], e["delta"]["partial_json"])
        for e in out
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert deltas == [(1, '{"city": '), (1, '"Oslo"}'), (2, '{"city": "Bergen"}')]
    stops = [e["index"] for e in out if e["type"] == "content_block_stop"]
    assert stops == [0, 1, 2]
    assert out[-2]["delta"]["stop_reason"] == "tool_use"


def test_parallel_calls_that_share_an_index_but_not_an_id_are_two_blocks() -> None:
    body = sse(tool_delta(0, "{}", "call_a", "a"), tool_delta(0, "{}", "call_b", "b"), "[DONE]")
    starts = [
        e["content_block"]["id"]
        for e in events(translate(body))
        if e["type"] == "content_block_start"
    ]
    assert starts == ["call_a", "call_b"]


def test_a_repeated_id_on_each_fragment_stays_one_block() -> None:
    body = sse(tool_delta(0, '{"a":', "call_a", "a"), tool_delta(0, "1}", "call_a"), "[DONE]")
    starts = [e for e in events(translate(body)) if e["type"] == "content_block_start"]
    assert len(starts) == 1


@pytest.mark.parametrize(
    ("body", "ended_by"),
    [
        (sse(chunk({"content": "a"}), "[DONE]"), "feed"),
        (sse(chunk({"content": "a"})), "close"),  # no [DONE]: the body's end is the end
        (sse(chunk({"content": "a"})) + b"data: [DONE]", "close"),  # its last blank line missing
    ],
)
def test_done_or_close_ends_the_message_exactly_once(body: bytes, ended_by: str) -> None:
    translator = StreamTranslator(MODEL)
    fed = translator.feed(body)
    closed = translator.close()
    types = [e["type"] for e in events(fed + closed)]
    counts = [types.count(kind) for kind in ("content_block_stop", "message_delta", "message_stop")]
    assert (counts, types[-1]) == ([1, 1, 1], "message_stop")
    assert (b"message_stop" in fed, b"message_stop" in closed) == (
        ended_by == "feed",
        ended_by == "close",
    )
    assert translator.close() == b""
    assert translator.feed(sse(chunk({"content": "late"}))) == b""


def test_no_chunks_at_all_still_make_a_well_formed_message() -> None:
    assert [e["type"] for e in events(translate(b""))] == [
        "message_start",
        "message_delta",
        "message_stop",
    ]
    assert events(translate(b": ping\n\n"))[0]["type"] == "message_start"


def test_usage_comes_from_the_usage_chunk() -> None:
    body = sse(chunk({"content": "a"}, "length"), usage_chunk(7, 5), "[DONE]")
    delta = events(translate(body))[-2]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"] == {"input_tokens": 7, "output_tokens": 5}


def streamed_stop_reason(finish: Any) -> str:
    reason: str = events(translate(sse(chunk({"content": "x"}, finish), "[DONE]")))[-2]["delta"][
        "stop_reason"
    ]
    return reason


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"error": {"message": "out of memory", "code": 500}}', "out of memory"),
        ('{"error": "model crashed"}', "model crashed"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_an_upstream_error_ends_the_stream_with_one_error_event(bad: str, message: str) -> None:
    translator = StreamTranslator(MODEL)
    out = translator.feed(sse(chunk({"content": "a"}), bad, chunk({"content": "b"}), "[DONE]"))
    assert translator.close() == b""
    parsed = events(out)
    assert [e["type"] for e in parsed] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert parsed[-1]["error"]["type"] == "api_error"
    assert message in parsed[-1]["error"]["message"]


def test_a_stream_cut_mid_event_is_an_error() -> None:
    out = events(translate(sse(chunk({"content": "a"})) + b'data: {"id": "chatcm'))
    assert out[-1]["type"] == "error"


# --- the real anthropic SDK reads what the translator writes ---------------------------------


def sdk_client(body: bytes, content_type: str) -> anthropic.Anthropic:
    def answer(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/messages"
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    return anthropic.Anthropic(
        api_key="test", base_url="http://gateway", http_client=http, max_retries=0
    )


def test_the_sdk_accumulates_a_translated_stream() -> None:
    body = sse(
        chunk({"content": "Let me check"}),
        chunk({"content": " the weather."}),
        tool_delta(0, "", "call_a", "weather"),
        *(tool_delta(0, part) for part in ['{"ci', 'ty": "Os', 'lo", "days": [1, ', "2]}"]),
        chunk({}, "tool_calls"),
        usage_chunk(31, 17),
        "[DONE]",
    )
    client = sdk_client(translate(body, step=5), "text/event-stream")
    with client.messages.stream(model="claude-local", max_tokens=64, messages=HELLO) as stream:
        message = stream.get_final_message()
    assert (message.id, message.model) == ("msg_chatcmpl-7", "claude-local")
    text_block, tool_block = message.content
    assert text_block.type == "text"
    assert text_block.text == "Let me check the weather."
    assert tool_block.type == "tool_use"
    assert (tool_block.id, tool_block.name) == ("call_a", "weather")
    assert tool_block.input == {"city": "Oslo", "days": [1, 2]}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (31, 17)


def test_the_sdk_reads_a_translated_stream_with_no_chunks() -> None:
    client = sdk_client(translate(b""), "text/event-stream")
    with client.messages.stream(model="claude-local", max_tokens=64, messages=HELLO) as stream:
        message = stream.get_final_message()
    assert (message.content, message.stop_reason) == ([], "end_turn")


def test_the_sdk_raises_on_a_translated_error_event() -> None:
    body = sse(chunk({"content": "a"}), '{"error": {"message": "out of memory"}}')
    client = sdk_client(translate(body), "text/event-stream")
    with pytest.raises(anthropic.APIStatusError, match="out of memory"):  # noqa: SIM117
        with client.messages.stream(model="claude-local", max_tokens=64, messages=HELLO) as stream:
            stream.get_final_message()


def test_the_sdk_parses_a_translated_message() -> None:
    answer = completion(
        {"content": "Sure.", "tool_calls": [call('{"city": "Oslo"}')]},
        "tool_calls",
        usage={"prompt_tokens": 12, "completion_tokens": 6},
    )
    client = sdk_client(json.dumps(from_chat(answer, "claude-local")).encode(), "application/json")
    message = client.messages.create(model="claude-local", max_tokens=64, messages=HELLO)
    assert (message.id, message.stop_reason) == ("msg_chatcmpl-9", "tool_use")
    text_block, tool_block = message.content
    assert text_block.type == "text"
    assert text_block.text == "Sure."
    assert tool_block.type == "tool_use"
    assert tool_block.input == {"city": "Oslo"}
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 6)


def test_the_sdk_parses_a_translated_error() -> None:
    body = error_from_chat(503, b'{"error": {"message": "loading model"}}')

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(503, content=body, headers={"content-type": "application/json"})

    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    client = anthropic.Anthropic(
        api_key="test", base_url="http://gateway", http_client=http, max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model="claude-local", max_tokens=64, messages=HELLO)
    assert caught.value.status_code == 503
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "loading model"},
    }
