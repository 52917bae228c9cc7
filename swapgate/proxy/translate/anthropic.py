"""Anthropic Messages <-> OpenAI chat completions, for a backend that speaks only chat.

A client's ``POST /v1/messages`` goes to such a backend as ``/v1/chat/completions`` (``to_chat``);
the answer comes back as a Message (``from_chat``) or, streamed, as Anthropic's events
(``StreamTranslator``, in swapgate/proxy/translate/anthropic_stream.py). Pure: dicts and bytes
in, dicts and bytes out.

What has no counterpart in chat is dropped, never imitated: the top-level fields in ``DROPPED``
(and any field neither carried nor named there), ``document`` blocks, ``thinking`` blocks of
earlier turns, ``cache_control`` and ``citations`` wherever they appear, and a streamed
``reasoning_content`` (an Anthropic thinking block needs a signature no engine can give). What
cannot be dropped without changing the question — a block chat has no place for, a server
tool, an image given as a file id — is a ``BadRequest`` that names where it is and what to send.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from swapgate.errors import BadRequest
from swapgate.proxy.translate.fields import as_dict, as_int, as_list, as_str

# Top-level request fields with no chat counterpart: dropped (docs cite this list).
DROPPED = (
    "cache_control",
    "container",
    "context_management",
    "diagnostics",
    "inference_geo",
    "mcp_servers",
    "output_config",
    "service_tier",
    "speed",
    "thinking",
)
_PASSED = ("max_tokens", "temperature", "top_p", "top_k")
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking", "document"})
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
    504: "timeout_error",
}
# Where a non-streamed tool call's arguments are not a JSON object, the text the engine wrote
# goes to the client under this key: an empty input would hide what went wrong.
RAW_ARGUMENTS = "_raw_arguments"


def to_chat(request: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages request body -> an OpenAI chat completions request body."""
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    model = request.get("model")  # a string, as parsed; the upstream's name replaces it
    chat: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
    chat["messages"] = _system(request.get("system")) + _messages(request.get("messages"))
    chat.update({name: request[name] for name in _PASSED if name in request})
    if "stop_sequences" in request:
        chat["stop"] = request["stop_sequences"]
    metadata = request.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    tools = _tools(request.get("tools") or [])
    choice = _tool_choice(request["tool_choice"]) if request.get("tool_choice") else {}
    if tools:  # engines refuse an empty tools list, and a tool_choice without tools
        chat.update(tools=tools, **choice)
    if request.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # else a stream never tells its usage
    return chat


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        return _instructions(system, "system")
    raise BadRequest("system: send a string or a list of text blocks", param="system")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise BadRequest("messages: send a list of {role, content} objects", param="messages")
    chat: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = as_str(message.get("role")) if isinstance(message, dict) else ""
        if role not in _TURNS:
            raise BadRequest(f"{where}: send an object whose role is 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
        elif isinstance(content, list):
            chat.extend(_TURNS[role](content, f"{where}.content"))
        else:
            raise BadRequest(f"{where}.content: send a string or a list of content blocks")
    return chat


def _instructions(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """A system prompt's text blocks as one string, the form every chat template reads."""
    text = "\n".join(_text(block, f"{where}[{i}]") for i, block in enumerate(blocks))
    return [{"role": "system", "content": text}]


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Tool results first, as chat wants each right after the call it answers; then the rest."""
    chat: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for kind, block, at in _each(blocks, where, ("text", "image", "tool_result")):
        if kind == "tool_result":
            chat.append(_tool_result(block, at, parts))
        else:
            parts.append(_part(block, at))
    if parts or not chat:
        chat.append({"role": "user", "content": _joined(parts)})
    return chat


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for kind, block, at in _each(blocks, where, ("text", "tool_use")):
        if kind == "text":
            texts.append(_text(block, at))
        else:
            calls.append(_tool_call(block, at))
    if not calls:
        return [{"role": "assistant", "content": "\n".join(texts)}]
    return [{"role": "assistant", "content": "\n".join(texts) or None, "tool_calls": calls}]


# What each role's content blocks become (a mid-conversation "system" message is the SDK's too).
_TURNS = {"user": _user, "assistant": _assistant, "system": _instructions}


def _each(
    blocks: list[Any], where: str, allowed: tuple[str, ...]
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Each block of an ``allowed`` type, with where it is; skipped ones left out; others a 400."""
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = as_str(block.get("type")) if isinstance(block, dict) else ""
        if kind in allowed:
            yield kind, block, at
        elif not kind:
            raise BadRequest(f"{at}: send a content block, an object with a string 'type'")
        elif kind not in _SKIPPED_BLOCKS:
            raise BadRequest(
                f"{at}: a {kind!r} block cannot reach this backend; send {', '.join(allowed)}"
            )


def _text(block: Any, where: str) -> str:
    text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
    if not isinstance(text, str):
        raise BadRequest(f"{where}: send a text block, {{'type': 'text', 'text': '...'}}")
    return text


def _part(block: dict[str, Any], where: str) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": _text(block, where)}
    source = as_dict(block.get("source"))
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    media, data = source.get("media_type"), source.get("data")
    if source.get("type") == "base64" and isinstance(media, str) and isinstance(data, str):
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    raise BadRequest(f"{where}.source: send {{'type': 'base64', 'media_type', 'data'}} or a url")


def _joined(parts: list[dict[str, Any]]) -> Any:
    """Text alone as one string: the one content form every engine's chat template reads."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _tool_result(block: dict[str, Any], where: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat tool message holds text only: a result's images go to the user message after it."""
    if not isinstance(block.get("tool_use_id"), str):
        raise BadRequest(f"{where}.tool_use_id: name the tool_use this result answers")
    content = block.get("content") or ""
    if isinstance(content, list):
        texts = []
        for kind, inner, at in _each(content, f"{where}.content", ("text", "image")):
            if kind == "text":
                texts.append(_text(inner, at))
            else:
                parts.append(_part(inner, at))
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f"{where}.content: send a string or a list of text blocks")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise BadRequest(f"{where}: a tool_use block needs a string 'id' and 'name'")
    if not isinstance(block.get("input"), dict):
        raise BadRequest(f"{where}.input: send the tool's input as a JSON object")
    function = {"name": block["name"], "arguments": json.dumps(block["input"])}
    return {"id": block["id"], "type": "function", "function": function}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools: send a list of tool definitions", param="tools")
    chat = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            raise BadRequest(
                f"tools[{i}]: only custom tools (name, input_schema) reach this backend"
            )
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"tools[{i}]: send a string 'name' and an object 'input_schema'")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        chat.append({"type": "function", "function": function})
    return chat


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        chat: dict[str, Any] = {
            "tool_choice": {"type": "function", "function": {"name": choice["name"]}}
        }
    elif isinstance(kind, str) and kind in _TOOL_CHOICE:
        chat = {"tool_choice": _TOOL_CHOICE[kind]}
    else:
        raise BadRequest(
            "tool_choice: send {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
            param="tool_choice",
        )
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    return chat


def from_chat(answer: dict[str, Any], model: str) -> dict[str, Any]:
    """A non-streaming chat.completion -> an Anthropic Message; ``model`` is the name the client
    asked for."""
    answer = as_dict(answer)
    choices = as_list(answer.get("choices"))
    choice = as_dict(choices[0] if choices else None)
    message = as_dict(choice.get("message"))
    text = as_str(message.get("content"))
    calls = [_tool_use(as_dict(call)) for call in as_list(message.get("tool_calls"))]
    content = ([{"type": "text", "text": text}] if text else []) + calls
    stop_reason = stop_reason_of(choice.get("finish_reason"), bool(calls))
    return anthropic_message(answer.get("id"), model, content, stop_reason, answer.get("usage"))


def anthropic_message(
    chat_id: Any, model: str, content: list[dict[str, Any]], stop_reason: str | None, usage: Any
) -> dict[str, Any]:
    """A Message, as answered whole or as a stream's message_start sends it before its content."""
    return {
        "id": "msg_" + _id(chat_id, ""),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": anthropic_usage(usage),
    }


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = as_dict(call.get("function"))
    name, arguments = as_str(function.get("name")), _arguments(function.get("arguments"))
    return {
        "type": "tool_use",
        "id": _id(call.get("id"), "toolu_"),
        "name": name,
        "input": arguments,
    }


def anthropic_usage(usage: Any) -> dict[str, int]:
    usage = as_dict(usage)
    return {
        "input_tokens": as_int(usage.get("prompt_tokens")),
        "output_tokens": as_int(usage.get("completion_tokens")),
    }


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}  # a call without parameters, as some engines write it
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError, RecursionError):
        parsed = None
    return parsed if isinstance(parsed, dict) else {RAW_ARGUMENTS: as_str(arguments)}


def stop_reason_of(finish_reason: Any, called_tools: bool) -> str:
    """Some engines end a turn of tool calls with "stop": a client only runs tools on tool_use."""
    reason = _STOP_REASON.get(finish_reason, "end_turn") if isinstance(finish_reason, str) else None
    return "tool_use" if called_tools and reason in (None, "end_turn") else reason or "end_turn"


def count_request(request: dict[str, Any]) -> dict[str, Any]:
    """/v1/messages/count_tokens body -> a chat request that makes the engine count the prompt."""
    chat = to_chat(request)
    chat.pop("stream_options", None)
    return {**chat, "max_tokens": 1, "stream": False}


def count_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """That chat answer -> ``{"input_tokens": usage.prompt_tokens}``."""
    return {"input_tokens": as_int(as_dict(as_dict(answer).get("usage")).get("prompt_tokens"))}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status: its own name, else api_error for a 5xx and
    invalid_request_error for the rest."""
    return _ERROR_TYPE.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> bytes:
    error = {"type": error_type(status), "message": message}
    return compact_json({"type": "error", "error": error})


def error_from_chat(status: int, body: bytes) -> bytes:
    """An upstream's error body, OpenAI-shaped or not, as Anthropic's error for ``status``."""
    return error_body(status, message_of(status, body))


def message_of(status: int, body: bytes) -> str:
    """What an upstream's error body says: its message, OpenAI-shaped or not, else the text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        payload = None
    return error_message(payload) or text or f"the backend answered {status}"


def error_message(payload: Any) -> str:
    """OpenAI's ``{"error": {"message"}}``; Ollama's ``{"error": "..."}``; a bare message."""
    error = as_dict(payload).get("error")
    if isinstance(error, str):
        return error
    return as_str(as_dict(error).get("message")) or as_str(as_dict(payload).get("message"))


def compact_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _id(value: Any, prefix: str) -> str:
    return value if isinstance(value, str) and value else prefix + uuid.uuid4().hex
