"""Ollama's API <-> OpenAI's, for every backend (docs/compatibility.md, "Ollama's API").

A client's ``POST /api/chat`` goes upstream as ``/v1/chat/completions``; ``/api/generate`` as
chat (its ``system`` and ``prompt`` a conversation of one turn) or, with ``raw``, as
``/v1/completions``; ``/api/embed`` and ``/api/embeddings`` as ``/v1/embeddings``. The answer
comes back as Ollama writes it: one JSON object, or NDJSON lines when streamed
(swapgate/proxy/translate/ollama_stream.py), the last with ``done``, its token counts and
durations in nanoseconds, ``load_duration`` being the time the request waited for its model.

What Ollama's ``options`` name and OpenAI's chat has is carried (``OPTIONS``); the rest is
dropped, as Ollama drops options it does not know. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from swapgate.errors import BadRequest
from swapgate.proxy.translate.fields import as_dict, as_int, as_list, as_str

Kind = Literal["chat", "generate", "embed", "embeddings"]
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
# Ollama's options with a chat completions counterpart: its name there
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repeat_penalty",
    "typical_p": "typical_p",
}
_DONE_REASON = {"stop": "stop", "length": "length", "tool_calls": "stop", "content_filter": "stop"}
_IMAGE_TYPES = {
    "iVBOR": "image/png",
    "/9j/": "image/jpeg",
    "R0lGOD": "image/gif",
    "UklGR": "image/webp",
}
NS = 1_000_000_000


def upstream_path(kind: Kind, payload: dict[str, Any]) -> str:
    if kind in ("embed", "embeddings"):
        return EMBEDDINGS_PATH
    if kind == "generate" and payload.get("raw") is True:
        return COMPLETIONS_PATH
    return CHAT_PATH


def to_openai(kind: Kind, payload: dict[str, Any], stream: bool) -> dict[str, Any]:
    """An Ollama request body -> the OpenAI body ``upstream_path`` takes."""
    if kind == "embed":
        return _embed(payload.get("input"), payload)
    if kind == "embeddings":
        return _embed(payload.get("prompt"), payload)
    body: dict[str, Any] = {}
    if kind == "generate" and payload.get("raw") is True:
        body["prompt"] = as_str(payload.get("prompt"))
        if isinstance(payload.get("suffix"), str):
            body["suffix"] = payload["suffix"]
    elif kind == "generate":
        body["messages"] = _generate_messages(payload)
    else:
        body["messages"] = _messages(payload.get("messages"))
        tools = as_list(payload.get("tools"))
        if tools:
            body["tools"] = tools
    body.update(_options(payload.get("options")))
    body.update(_format(payload.get("format")))
    body.update(_think(payload.get("think")))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _embed(given: Any, payload: dict[str, Any]) -> dict[str, Any]:
    if isinstance(given, str) or (isinstance(given, list) and given):
        body: dict[str, Any] = {"input": given}
        if isinstance(payload.get("dimensions"), int):
            body["dimensions"] = payload["dimensions"]
        return body
    raise BadRequest("input: send a string or a list of strings to embed", param="input")


def _generate_messages(payload: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = payload.get("system")
    if isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    prompt = as_str(payload.get("prompt"))
    messages.append({"role": "user", "content": _content(prompt, payload.get("images"))})
    return messages


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise BadRequest("messages: send a list of {role, content} objects", param="messages")
    chat: list[dict[str, Any]] = []
    calls: list[tuple[str, str]] = []  # (id, name) of tool calls not answered yet
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}]: send an object with a role and its content")
        role, content = message["role"], as_str(message.get("content"))
        if role == "tool":
            chat.append(_tool_result(message, content, calls))
            continue
        turn: dict[str, Any] = {"role": role, "content": _content(content, message.get("images"))}
        made = [_tool_call(call, f"call_{i}_{k}") for k, call in enumerate(_calls(message))]
        if made:
            turn["tool_calls"] = made
            calls += [(call["id"], call["function"]["name"]) for call in made]
        chat.append(turn)
    return chat


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [as_dict(call) for call in as_list(message.get("tool_calls"))]


def _tool_call(call: dict[str, Any], call_id: str) -> dict[str, Any]:
    function = as_dict(call.get("function"))
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    name = as_str(function.get("name"))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _tool_result(
    message: dict[str, Any], content: str, calls: list[tuple[str, str]]
) -> dict[str, Any]:
    """A tool's answer, given to the call it answers: the oldest open call of its
    ``tool_name``, else the oldest open call (Ollama's clients name the tool, not the call)."""
    name = as_str(message.get("tool_name")) or as_str(message.get("name"))
    match = next((c for c in calls if c[1] == name), calls[0] if calls else None)
    if match is None:
        return {"role": "tool", "tool_call_id": "call_none", "content": content}
    calls.remove(match)
    return {"role": "tool", "tool_call_id": match[0], "content": content}


def _content(text: str, images: Any) -> str | list[dict[str, Any]]:
    """Text, or text and images (Ollama's base64 strings) as chat's content parts."""
    pictures = [image for image in as_list(images) if isinstance(image, str) and image]
    if not pictures:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in pictures:
        url = image if image.startswith("data:") else f"data:{_image_type(image)};base64,{image}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _image_type(data: str) -> str:
    return next(
        (kind for prefix, kind in _IMAGE_TYPES.items() if data.startswith(prefix)), "image/png"
    )


def _options(options: Any) -> dict[str, Any]:
    carried = {}
    for name, value in as_dict(options).items():
        if name not in OPTIONS or value is None:
            continue
        if name == "num_predict" and (not isinstance(value, int) or value < 0):
            continue  # -1 (no limit) and -2 (fill the context): the engine's own limit
        carried[OPTIONS[name]] = value
    return carried


def _format(given: Any) -> dict[str, Any]:
    """``format``: ``"json"``, or a JSON schema the answer must follow."""
    if given is None or given == "":
        return {}
    if given == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(given, dict):
        schema = {"name": "answer", "schema": given, "strict": True}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise BadRequest('format: send "json" or a JSON schema object', param="format")


def _think(think: Any) -> dict[str, Any]:
    """``think``: false turns a reasoning model's thinking off (its chat template's
    ``enable_thinking``); a level is chat's ``reasoning_effort``."""
    if think is False:
        return {"chat_template_kwargs": {"enable_thinking": False}}
    if think in ("low", "medium", "high"):
        return {"reasoning_effort": think}
    return {}


# -- answers -------------------------------------------------------------------------------------


def now_text() -> str:
    """Ollama's ``created_at``: RFC 3339 with nanoseconds, in UTC."""
    seconds = time.time()
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1e9):09d}Z"


def done_reason(finish_reason: Any) -> str:
    return _DONE_REASON.get(as_str(finish_reason), "stop")


def tool_calls(calls: list[Any]) -> list[dict[str, Any]]:
    """Chat's tool calls as Ollama gives them: arguments as an object, not a string."""
    made = []
    for call in map(as_dict, calls):
        function = as_dict(call.get("function"))
        made.append(
            {
                "function": {
                    "name": as_str(function.get("name")),
                    "arguments": arguments(function.get("arguments")),
                }
            }
        )
    return made


def arguments(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        parsed = json.loads(as_str(text) or "{}")
    except ValueError:
        return {"_raw_arguments": as_str(text)}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def from_chat(kind: Kind, answer: dict[str, Any], model: str, times: Times) -> dict[str, Any]:
    """A chat (or completions) answer -> Ollama's final object."""
    choice = as_dict((as_list(answer.get("choices")) or [{}])[0])
    usage = as_dict(answer.get("usage"))
    out: dict[str, Any] = {"model": model, "created_at": now_text()}
    if kind == "generate":
        message = as_dict(choice.get("message"))
        text = as_str(choice.get("text")) or as_str(message.get("content"))
        out["response"] = text
        if message.get("reasoning_content"):
            out["thinking"] = as_str(message["reasoning_content"])
    else:
        message = as_dict(choice.get("message"))
        said: dict[str, Any] = {"role": "assistant", "content": as_str(message.get("content"))}
        if message.get("reasoning_content"):
            said["thinking"] = as_str(message["reasoning_content"])
        if as_list(message.get("tool_calls")):
            said["tool_calls"] = tool_calls(message["tool_calls"])
        out["message"] = said
    return out | final(done_reason(choice.get("finish_reason")), usage, times)


def final(reason: str, usage: dict[str, Any], times: Times, tokens_out: int = 0) -> dict[str, Any]:
    """What Ollama's last object carries: ``done``, why, the counts and the durations."""
    return {
        "done": True,
        "done_reason": reason,
        **times.durations(),
        "prompt_eval_count": as_int(usage.get("prompt_tokens")),
        "eval_count": as_int(usage.get("completion_tokens")) or tokens_out,
    }


def from_embeddings(kind: Kind, answer: dict[str, Any], model: str, times: Times) -> dict[str, Any]:
    vectors = [as_list(as_dict(item).get("embedding")) for item in as_list(answer.get("data"))]
    if kind == "embeddings":  # the older endpoint: one prompt, one vector
        return {"embedding": vectors[0] if vectors else []}
    usage = as_dict(answer.get("usage"))
    durations = times.durations()
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": durations["total_duration"],
        "load_duration": durations["load_duration"],
        "prompt_eval_count": as_int(usage.get("prompt_tokens")),
    }


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}, separators=(",", ":")).encode()


def error_from_upstream(status: int, body: bytes) -> bytes:
    """An upstream's error answer, as Ollama's ``{"error": "..."}``."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = as_dict(parsed).get("error") if isinstance(parsed, dict) else None
    message = as_str(error.get("message")) if isinstance(error, dict) else as_str(error)
    return error_body(
        message or body.decode("utf-8", "replace")[:500] or f"the backend answered {status}"
    )


class Times:
    """A request's clock for Ollama's durations: ``load_duration`` is what it waited for its
    model (swapgate's swap wait), the prompt's from sending to the first token, the output's
    from there to the end."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.waited = 0.0
        self.sent = self.first = 0.0

    def send(self, waited: float) -> None:
        self.waited = waited
        self.sent = time.perf_counter()

    def token(self) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def durations(self) -> dict[str, int]:
        end = time.perf_counter()
        sent = self.sent or end
        first = self.first or end
        return {
            "total_duration": round((end - self.began) * NS),
            "load_duration": round(self.waited * NS),
            "prompt_eval_duration": round((first - sent) * NS),
            "eval_duration": round((end - first) * NS),
        }
