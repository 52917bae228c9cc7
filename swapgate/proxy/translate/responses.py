"""OpenAI Responses <-> chat completions, for a backend that speaks only chat (Codex and the
openai SDK's ``responses.create`` in front of llama-cpp-python and other chat-only servers).

A client's ``POST /v1/responses`` goes to such a backend as ``/v1/chat/completions``
(``to_chat``); the answer comes back as a Response (``from_chat``) or, streamed, as the
Responses event sequence (``ResponsesStream``, in
swapgate/proxy/translate/responses_stream.py). Pure: dicts in, dicts out.
docs/compatibility.md lists what is carried.

swapgate keeps no responses: ``previous_response_id``, ``conversation`` and ``background`` are
refused (send the whole conversation in ``input``). What has no counterpart in chat is dropped:
the fields in ``DROPPED`` (and any other field not carried), ``reasoning`` items of earlier
turns, and tools no engine can run — hosted ones (``web_search``, ``file_search``, …) and
``namespace`` groups (Codex's sub-agent tools): the engine is simply not offered them, as
Codex offers web search to every model.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from swapgate.errors import BadRequest
from swapgate.proxy.translate.anthropic import message_of
from swapgate.proxy.translate.fields import as_dict, as_int, as_list, as_str

DROPPED = (
    "include",
    "metadata",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "top_logprobs",
    "truncation",
    "user",
    "prompt_cache_retention",
    "stream_options",
)
REFUSED = {
    "previous_response_id": "swapgate keeps no responses: send the whole conversation in input",
    "conversation": "swapgate keeps no conversations: send the whole conversation in input",
    "prompt": "stored prompts are not available here: send instructions and input",
}
_PASSED = ("temperature", "top_p", "parallel_tool_calls")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_SKIPPED_ITEMS = frozenset({"reasoning"})
# A "custom" (free-form) tool becomes a function with this one string parameter.
CUSTOM_INPUT = "input"


def to_chat(request: dict[str, Any]) -> dict[str, Any]:
    """A Responses request body -> a chat completions request body."""
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    for name, why in REFUSED.items():
        if request.get(name) not in (None, ""):
            raise BadRequest(f"{name}: {why}", param=name)
    if request.get("background") is True:
        raise BadRequest("background: this backend answers in the foreground only")
    model = request.get("model")  # a string, as parsed; the upstream's name replaces it
    chat: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
    chat["messages"] = _instructions(request.get("instructions")) + _input(request.get("input"))
    chat.update({name: request[name] for name in _PASSED if name in request})
    if isinstance(request.get("max_output_tokens"), int):
        chat["max_tokens"] = request["max_output_tokens"]
    chat.update(_format(as_dict(request.get("text")).get("format")))
    tools = _tools(request.get("tools") or [])
    if tools:  # engines refuse an empty tools list, and a tool_choice without tools
        chat["tools"] = tools
        if request.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(request["tool_choice"])
    if request.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # else a stream never tells its usage
    return chat


def custom_tools(request: dict[str, Any]) -> frozenset[str]:
    """The names of the request's free-form tools, whose calls go back as ``custom_tool_call``."""
    return frozenset(
        as_str(tool.get("name"))
        for tool in map(as_dict, as_list(request.get("tools")))
        if tool.get("type") == "custom"
    )


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    if instructions in (None, ""):
        return []
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}]
    raise BadRequest("instructions: send a string", param="instructions")


def _input(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise BadRequest("input: send a string or a list of items", param="input")
    chat: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: send an item, an object")
        kind = item.get("type", "message")
        if kind == "message":
            chat.append(anthropic_message(item, where))
        elif kind in ("function_call", "custom_tool_call"):
            _call(chat, item, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            chat.append(_output(item, where))
        elif kind not in _SKIPPED_ITEMS:
            raise BadRequest(f"{where}: a {kind!r} item cannot reach this backend")
    return chat


def anthropic_message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(as_str(item.get("role")))
    if role is None:
        raise BadRequest(f"{where}.role: send 'user', 'assistant', 'system' or 'developer'")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: send a string or a list of content parts")
    parts = [_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if role != "user" or all(part["type"] == "text" for part in parts):
        # every chat template reads a string; only a user turn may carry images
        return {"role": role, "content": "\n".join(as_str(p.get("text")) for p in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = as_str(as_dict(part).get("type"))
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_image":
        raise BadRequest(f"{where}: send the image as image_url (a URL or a data: URL)")
    raise BadRequest(f"{where}: a {kind or 'typeless'!r} part cannot reach this backend")


def _call(chat: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A call the model made earlier: joined to the assistant turn before it, as chat has it."""
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise BadRequest(f"{where}: a call needs a string 'call_id' and 'name'")
    if item.get("type") == "custom_tool_call":
        arguments = json.dumps({CUSTOM_INPUT: as_str(item.get("input"))})
    else:
        arguments = as_str(item.get("arguments")) or "{}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = chat[-1] if chat else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    elif last is not None and last["role"] == "assistant":
        last["tool_calls"] = [call]
    else:
        chat.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output(item: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str):
        raise BadRequest(f"{where}.call_id: name the call this output answers")
    output = item.get("output")
    if isinstance(output, list):
        output = "\n".join(as_str(as_dict(part).get("text")) for part in output)
    if not isinstance(output, str):
        raise BadRequest(f"{where}.output: send a string or a list of text parts")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _format(fmt: Any) -> dict[str, Any]:
    fmt = as_dict(fmt)
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    if fmt.get("type") == "json_object":
        return {"response_format": {"type": "json_object"}}
    return {}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools: send a list of tool definitions", param="tools")
    chat = []
    for i, tool in enumerate(tools):
        kind = as_dict(tool).get("type")
        if kind not in ("function", "custom"):
            continue  # hosted or grouped tools: not offered to an engine that cannot run them
        if not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}]: a {kind} tool needs a string 'name'")
        if kind == "custom":
            parameters = {
                "type": "object",
                "properties": {CUSTOM_INPUT: {"type": "string"}},
                "required": [CUSTOM_INPUT],
            }
        else:
            parameters = as_dict(tool.get("parameters")) or {"type": "object", "properties": {}}
        function: dict[str, Any] = {"name": tool["name"], "parameters": parameters}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        chat.append({"type": "function", "function": function})
    return chat


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    name = as_dict(choice).get("name")
    if as_dict(choice).get("type") in ("function", "custom") and isinstance(name, str):
        return {"type": "function", "function": {"name": name}}
    raise BadRequest(
        "tool_choice: send 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def from_chat(answer: dict[str, Any], model: str, custom: frozenset[str]) -> dict[str, Any]:
    """A non-streaming chat.completion -> a Response; ``model`` is the name the client asked
    for, ``custom`` the names of its free-form tools."""
    answer = as_dict(answer)
    choice = as_dict((as_list(answer.get("choices")) or [None])[0])
    message = as_dict(choice.get("message"))
    output = []
    if as_str(message.get("content")):
        output.append(text_item(new_id("msg_"), as_str(message.get("content")), "completed"))
    for call in map(as_dict, as_list(message.get("tool_calls"))):
        function = as_dict(call.get("function"))
        name, arguments = as_str(function.get("name")), function.get("arguments")
        call_id = as_str(call.get("id")) or new_id("call_")
        output.append(call_item(new_id("fc_"), call_id, name, as_str(arguments), custom))
    usage = usage_from_chat(answer.get("usage"), 0)
    return response(answer.get("id"), model, output, _status(choice.get("finish_reason")), usage)


def response(
    chat_id: Any, model: str, output: list[dict[str, Any]], status: str, usage: Any
) -> dict[str, Any]:
    """A Response object, whole or as a stream's first and last events carry it."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": "resp_" + (chat_id if isinstance(chat_id, str) and chat_id else uuid.uuid4().hex),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if text or status == "completed" else [],
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, custom: frozenset[str]
) -> dict[str, Any]:
    """A function call, or a free-form tool's call with the text the engine put in its one
    parameter."""
    if name in custom:
        try:
            text = as_str(as_dict(json.loads(arguments)).get(CUSTOM_INPUT))
        except (ValueError, RecursionError):
            text = arguments
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "input": text,
            "status": "completed",
        }
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def usage_from_chat(usage: Any, estimate: int) -> dict[str, Any]:
    """Responses' usage from chat's; ``estimate`` stands in for a prompt the engine did not
    count (a stream whose engine ignores ``stream_options``)."""
    usage = as_dict(usage)
    prompt = as_int(usage.get("prompt_tokens")) or estimate
    completion = as_int(usage.get("completion_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def _status(finish_reason: Any) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def error_from_chat(status: int, body: bytes) -> bytes:
    """An upstream's error body as OpenAI's error object (what Responses answers too)."""
    error = {
        "message": message_of(status, body),
        "type": "upstream_error",
        "param": None,
        "code": status,
    }
    return json.dumps({"error": error}, separators=(",", ":")).encode()
