"""OpenAI Responses <-> chat completions (swapgate/proxy/translate/responses.py and
responses_stream.py):
what Codex and ``responses.create`` send, as a chat-only engine must get it, and back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from swapgate.errors import BadRequest
from swapgate.proxy.translate.responses import custom_tools, from_chat, to_chat
from swapgate.proxy.translate.responses_stream import ResponsesStream
from tests.unit.proxy.translate.test_anthropic import BOUNDED, JSON

FIELDS = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "stream",
    "previous_response_id",
    "store",
    "reasoning",
]

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = to_chat(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "hi",
            "max_output_tokens": 16,
            "temperature": 0.2,
        }
    )
    assert chat == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "max_tokens": 16,
    }


def text(role: str, kind: str, words: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": words}]}


def call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments}


def chat_call(call_id: str, arguments: str) -> dict[str, Any]:
    function = {"name": "shell", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


def test_codex_style_items_become_chat_turns_with_calls_and_their_outputs() -> None:
    items = [
        text("developer", "input_text", "Rules."),
        text("user", "input_text", "ls"),
        {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},  # dropped
        text("assistant", "output_text", "Running."),
        call("c1", '{"cmd":"ls"}'),
        call("c2", '{"cmd":"pwd"}'),
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "/w"}],
        },
    ]
    chat = to_chat({"model": "m", "input": items, "stream": True})
    calls = [chat_call("c1", '{"cmd":"ls"}'), chat_call("c2", '{"cmd":"pwd"}')]
    assert chat["messages"] == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "ls"},
        {"role": "assistant", "content": "Running.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "/w"},
    ]
    assert chat["stream_options"] == {"include_usage": True}


def test_function_and_custom_tools_and_the_choice_of_one() -> None:
    tools = [
        {
            "type": "function",
            "name": "shell",
            "description": "Run.",
            "parameters": {"type": "object"},
        },
        {"type": "custom", "name": "apply_patch", "description": "Patch."},
    ]
    request = {
        "model": "m",
        "input": "x",
        "tools": tools,
        "tool_choice": {"type": "function", "name": "shell"},
    }
    chat = to_chat(request)
    assert chat["tools"][0] == {
        "type": "function",
        "function": {"name": "shell", "parameters": {"type": "object"}, "description": "Run."},
    }
    patch = chat["tools"][1]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "shell"}}
    assert custom_tools(request) == frozenset({"apply_patch"})


def test_a_json_schema_format_becomes_chats_response_format() -> None:
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    chat = to_chat({"model": "m", "input": "x", "text": {"format": fmt}})
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": True},
    }


@pytest.mark.parametrize(
    ("request_fields", "says"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id: swapgate keeps no responses"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "function"}]}, "tools[0]: a function tool needs a string 'name'"),
        ({"input": [{"type": "file_search_call", "id": "x"}]}, "input[0]: a 'file_search_call'"),
        ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": 3}, "input: send a string or a list"),
    ],
)
def test_what_cannot_be_carried_is_a_400_that_says_what_to_send(request_fields, says) -> None:
    with pytest.raises(BadRequest, match=says.replace("[", r"\[").replace("]", r"\]")):
        to_chat({"model": "m", "input": "x", **request_fields})


def test_tools_no_engine_can_run_are_not_offered_to_it() -> None:
    shell = {"type": "function", "name": "shell", "parameters": {"type": "object"}}
    agents = {"type": "namespace", "name": "multi_agent_v1", "tools": [shell]}
    hosted = {"type": "web_search", "external_web_access": False}
    chat = to_chat(
        {"model": "m", "input": "x", "tools": [shell, agents, hosted], "tool_choice": "auto"}
    )
    assert [t["function"]["name"] for t in chat["tools"]] == ["shell"]
    only_hosted = to_chat({"model": "m", "input": "x", "tools": [hosted], "tool_choice": "auto"})
    assert "tools" not in only_hosted
    assert "tool_choice" not in only_hosted


def test_dropped_fields_do_not_reach_the_engine() -> None:
    dropped = {
        "store": True,
        "reasoning": {"effort": "low"},
        "prompt_cache_key": "k",
        "include": ["reasoning.encrypted_content"],
    }
    chat = to_chat({"model": "m", "input": "x", **dropped})
    assert set(chat) == {"model", "messages"}


def test_a_whole_answer_with_text_and_calls_is_a_response() -> None:
    answer = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Let me look.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "shell", "arguments": "{}"},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {
                                "name": "apply_patch",
                                "arguments": '{"input": "*** patch"}',
                            },
                        },
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7},
    }
    response = from_chat(answer, "coder", frozenset({"apply_patch"}))
    assert response["id"] == "resp_chatcmpl-1"
    assert (response["status"], response["model"]) == ("completed", "coder")
    message, call, custom = response["output"]
    assert message["content"][0] == {
        "type": "output_text",
        "text": "Let me look.",
        "annotations": [],
    }
    assert (call["type"], call["call_id"], call["name"]) == ("function_call", "c1", "shell")
    assert (custom["type"], custom["input"]) == ("custom_tool_call", "*** patch")
    assert response["usage"]["input_tokens"] == 12
    assert response["usage"]["total_tokens"] == 19


def test_an_answer_cut_at_max_tokens_is_incomplete() -> None:
    answer = {"choices": [{"finish_reason": "length", "message": {"content": "abc"}}]}
    response = from_chat(answer, "m", frozenset())
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def chat_stream(*chunks: dict[str, Any], done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def translated(body: bytes, estimate: int = 5, split: int = 7) -> list[dict[str, Any]]:
    """Feed ``body`` in ``split``-byte pieces; every event out, parsed by the openai SDK's own
    event types (which raise on a shape the SDK does not know)."""
    stream = ResponsesStream("coder", frozenset({"apply_patch"}), estimate)
    out = b"".join(stream.feed(body[i : i + split]) for i in range(0, len(body), split))
    out += stream.close()
    events = []
    for block in out.decode().split("\n\n"):
        if block:
            kind, data = block.split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert kind == "event: " + event["type"]
            EVENTS.validate_python(event)
            events.append(event)
    return events


def test_a_text_stream_is_the_responses_event_sequence() -> None:
    body = chat_stream(
        {"id": "chatcmpl-9", "choices": [{"delta": {"role": "assistant", "content": "Hel"}}]},
        {"id": "chatcmpl-9", "choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
    )
    events = translated(body)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["id"] == "resp_chatcmpl-9"
    assert done["output"][0]["content"][0]["text"] == "Hello"
    assert done["usage"]["input_tokens"] == 9


def test_streamed_tool_calls_arrive_as_argument_deltas_then_whole_items() -> None:
    def call(index: int, **function: str) -> dict[str, Any]:
        first = {"id": f"c{index}"} if "name" in function else {}
        return {
            "choices": [
                {"delta": {"tool_calls": [{"index": index, **first, "function": function}]}}
            ]
        }

    body = chat_stream(
        call(0, name="shell", arguments='{"cmd":'),
        call(0, arguments='"ls"}'),
        call(1, name="apply_patch", arguments='{"input":"*** p"}'),
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    )
    events = translated(body)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"cmd":', '"ls"}', '{"input":"*** p"}']
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert items[0]["type"] == "function_call"
    assert (items[0]["call_id"], items[0]["arguments"]) == ("c0", '{"cmd":"ls"}')
    assert (items[1]["type"], items[1]["input"]) == ("custom_tool_call", "*** p")
    assert events[-1]["response"]["output"] == items


def test_a_stream_without_usage_reports_the_estimate_never_zero() -> None:
    body = chat_stream({"choices": [{"delta": {"content": "Hi"}, "finish_reason": "stop"}]})
    usage = translated(body, estimate=42)[-1]["response"]["usage"]
    assert usage["input_tokens"] == 42
    assert usage["output_tokens"] == 1


def test_a_stream_cut_at_max_tokens_ends_incomplete() -> None:
    body = chat_stream({"choices": [{"delta": {"content": "abc"}, "finish_reason": "length"}]})
    assert translated(body)[-1]["type"] == "response.incomplete"


def test_an_upstream_error_mid_stream_is_one_response_failed() -> None:
    body = chat_stream(
        {"choices": [{"delta": {"content": "a"}}]}, {"error": {"message": "engine died"}}
    )
    events = translated(body)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"] == "engine died"
    assert sum(e["type"] == "response.failed" for e in events) == 1


def test_a_body_that_ends_without_done_still_completes() -> None:
    body = chat_stream({"choices": [{"delta": {"content": "a"}}]}, done=False)
    assert translated(body)[-1]["type"] == "response.completed"


@BOUNDED
@given(st.dictionaries(st.sampled_from(FIELDS), JSON) | JSON)
def test_any_request_translates_to_json_or_is_a_bad_request(request: Any) -> None:
    try:
        chat = to_chat(request)
    except BadRequest:
        return
    json.dumps(chat, allow_nan=False)


@BOUNDED
@given(JSON, st.binary(max_size=300))
def test_any_answer_or_stream_translates(answer: Any, stream: bytes) -> None:
    json.dumps(from_chat(answer, "m", frozenset({"x"})))
    translator = ResponsesStream("m", frozenset(), 1)
    translator.feed(stream)
    translator.close()
