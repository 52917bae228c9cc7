"""Prefix affinity (docs/architecture.md, "Prefix affinity"): among warm copies of a model, a
conversation goes back to the copy that served it last, whose engine still holds its prompt's
KV cache, unless that copy is busier than the least busy one by more than ``slack`` requests.

A conversation is known by its model and the start of its prompt, which every turn repeats:
the system prompt (``system``, ``instructions``) and its first two messages (or the start of a
completion's ``prompt``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

Affinity = Literal["hit", "miss", "overflow"]
HEAD_CHARS = 2048  # of a plain prompt (completions): its start names its conversation


def conversation(model: str, payload: Mapping[str, Any]) -> str | None:
    """A short key of the conversation ``payload`` belongs to; None when it has no prompt."""
    head: list[Any] = [payload[key] for key in ("system", "instructions") if payload.get(key)]
    for key in ("messages", "input"):
        value = payload.get(key)
        if isinstance(value, list) and value:
            head += value[:2]
            break
        if isinstance(value, str) and value:
            head.append(value[:HEAD_CHARS])
            break
    prompt = payload.get("prompt")
    if isinstance(prompt, str) and prompt:
        head.append(prompt[:HEAD_CHARS])
    if not head:
        return None
    text = json.dumps([model, head], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def choose(
    last: str | None, open_copies: Mapping[str, int], least: str, slack: int
) -> tuple[str, Affinity]:
    """Where a conversation goes among ``open_copies`` (instance: its requests in flight)
    that can take it now; ``last``: the copy that served it last; ``least``: where it would go
    without affinity."""
    if last is None or last not in open_copies:
        return least, "miss"
    if open_copies[last] - min(open_copies.values()) > slack:
        return least, "overflow"
    return last, "hit"
