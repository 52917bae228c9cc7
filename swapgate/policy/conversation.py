"""A conversation's identity (docs/kv-keep.md, "Which requests are one conversation"): what
every turn of it repeats, the same from its first turn on, read per API shape:

=================  =========================================================================
chat completions   the ``system``/``developer`` messages before the first user message, and
                   the first user message
Anthropic Messages the top-level ``system`` and the first user message
Responses          ``instructions`` and the first input item (a string ``input``: its start)
anything else      none: completions, embeddings, rerank, ``count_tokens`` take no slot
=================  =========================================================================

Only what stays the same from turn to turn counts: a content block's ``cache_control`` (which
Claude Code moves to the newest message at every turn) is left out, and so is Claude Code's
``x-anthropic-billing-header:`` line in ``system``, which changes at every request. Where the
client names its session (Codex's ``prompt_cache_key``, Claude Code's ``metadata.user_id``), the
name is part of the identity: two sessions started alike in one folder are two conversations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

HEAD_CHARS = 2048  # of a string ``input``: its start names its conversation
# Per API shape (an endpoint's label): the requests that are turns of a conversation
SHAPES = frozenset({"chat", "messages", "responses"})
# Keys of a block that say how to send it, not what the engine reads
_NOT_READ = frozenset({"cache_control", "cache_reference"})
BILLING = "x-anthropic-billing-header:"


def identity(shape: str, model: str, payload: Mapping[str, Any]) -> str | None:
    """A short key of the conversation ``payload`` (a request of API ``shape``) belongs to;
    None when it is not a turn of one."""
    head = _head(shape, payload)
    if not head:
        return None
    text = json.dumps([model, head], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def scoped(key: str, tenant: str | None) -> str:
    """``key`` as one client key's own: another key's identical conversation is another one."""
    if tenant is None:
        return key
    return hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:20]


def _head(shape: str, payload: Mapping[str, Any]) -> list[Any]:
    if shape == "chat":
        head = _chat(payload.get("messages"))
    elif shape == "messages":
        first = _first_user(payload.get("messages"))
        head = [_system(payload.get("system")), first] if first is not None else []
    elif shape == "responses":
        head = _responses(payload.get("instructions"), payload.get("input"))
    else:
        return []
    session = _session(payload)
    return [*head, session] if head and session else head


def _session(payload: Mapping[str, Any]) -> str | None:
    """The session the client names, if it names one."""
    key = payload.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key
    metadata = payload.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) and user else None


def _system(system: Any) -> Any:
    """A top-level ``system`` without Claude Code's billing line (a new hash every request)."""
    if isinstance(system, str):
        return _unbilled(system)
    if isinstance(system, list):
        blocks = [_read(block) for block in system]
        for block in blocks:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                block["text"] = _unbilled(block["text"])
        return [b for b in blocks if not (isinstance(b, dict) and b.get("text") == "")]
    return _read(system)


def _unbilled(text: str) -> str:
    if BILLING not in text:
        return text
    return "\n".join(line for line in text.split("\n") if not line.startswith(BILLING))


def _chat(messages: Any) -> list[Any]:
    if not isinstance(messages, list):
        return []
    head: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            head.append(_read(message.get("content")))
        elif role == "user":
            return [*head, _read(message.get("content"))]
    return []  # no user message yet: nothing a later turn repeats for sure


def _first_user(messages: Any) -> Any:
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _read(message.get("content"))
    return None


def _responses(instructions: Any, items: Any) -> list[Any]:
    if isinstance(items, str) and items:
        return [_read(instructions), items[:HEAD_CHARS]]
    if isinstance(items, list) and items:
        return [_read(instructions), _read(items[0])]
    return []


def _read(value: Any) -> Any:
    """``value`` as the engine reads it: strings as they are, blocks without what only says
    how to send them."""
    if isinstance(value, dict):
        return {k: _read(v) for k, v in value.items() if k not in _NOT_READ}
    if isinstance(value, list):
        return [_read(item) for item in value]
    return value
