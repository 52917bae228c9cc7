"""Per-request routing (docs/operations.md): the pool a request may use, by its prompt, and how long
it may wait (``x-swapgate-max-wait``, read by swapgate/proxy/headers.py).

A model's ``pools`` are tried in order; the first whose ``max_prompt_tokens`` the prompt fits
wins, unless all its instances are down or drained: then the next pool it fits. A prompt that
fits no pool is a 400 naming the limits. The prompt's size is estimated from the body already
parsed (characters of its text / 4): no second parse, no tokenizer on the request path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swapgate.config.settings import PoolConfig
from swapgate.data.snapshot import Snapshot
from swapgate.errors import BadRequest

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    instances: frozenset[str]


def prompt_tokens(payload: dict[str, Any]) -> int:
    """The prompt's size in tokens, estimated: its characters / 4, rounded up."""
    chars = sum(len(text) for text in _texts(payload))
    return math.ceil(chars / CHARS_PER_TOKEN)


def _texts(payload: dict[str, Any]) -> list[str]:
    """The text of the messages (chat, Messages), a prompt (completions) or an input."""
    found: list[str] = []
    for key in ("prompt", "input", "system"):
        _collect(payload.get(key), found)
    for message in payload.get("messages") or []:
        if isinstance(message, dict):
            _collect(message.get("content"), found)
    return found


def _collect(value: object, found: list[str]) -> None:
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, str):
                found.append(part)
            elif isinstance(part, dict):
                _collect(part.get("text") or part.get("content"), found)


def choose(model: str, pools: Sequence[PoolConfig], tokens: int, snap: Snapshot) -> Pool:
    """The pool for a prompt of ``tokens`` (``pools`` not empty)."""
    fitting = [p for p in pools if p.max_prompt_tokens is None or tokens <= p.max_prompt_tokens]
    if not fitting:
        limits = ", ".join(f"{p.name} {p.max_prompt_tokens}" for p in pools)
        raise BadRequest(
            f"the prompt (about {tokens} tokens) is longer than every pool of {model!r} takes"
            f" (max_prompt_tokens: {limits}); send a shorter prompt"
        )
    serving = {i.name for i in snap.instances if i.up and not i.drained}
    chosen = next((p for p in fitting if serving & set(p.instances)), fitting[0])
    return Pool(chosen.name, frozenset(chosen.instances))
