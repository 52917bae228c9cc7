"""A model's request parameters (``models.M.params``) and what it can do (``capabilities``):
their schema, and the rule ``Params`` that the proxy applies to each request body
(docs/configuration.md, "Request parameters per model").

A key is a top-level name of the request body (``temperature``) or a dotted path into an
object of it (``chat_template_kwargs.enable_thinking``): the operator can force one switch of a
nested object and leave the client's others alone. The rule removes the ``strip`` keys, sets
the ``default`` keys the client did not send, then forces the ``set`` keys, so that a forced
``a.b`` lands inside a defaulted ``a``. It applies to the body in the client's API shape, before
any translation; a Messages or Responses request translated to chat carries what its
translation maps (``temperature``), and the keys its own API does not have
(``chat_template_kwargs``, ``n_probs``) are given to the chat body too (``into_chat``).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

# What /v1/models says a model can do, when its config or its engine tells
Capability = Literal["vision", "tools", "embeddings", "reasoning"]
# The body's keys swapgate itself owns: which model answers, and whether it streams
OWNED = frozenset({"model", "stream"})
Path = tuple[str, ...]
Chat = dict[str, Any]


def path_of(key: str) -> tuple[str, ...]:
    """A key as the path it names: ``a.b`` is ``b`` inside the object ``a``."""
    return tuple(key.split("."))


class ParamsConfig(BaseModel):
    """``set``: forced into every request body; ``default``: set where the client did not;
    ``strip``: removed. Values are any JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    set: dict[str, Any] = {}
    default: dict[str, Any] = {}
    strip: list[str] = []

    @field_validator("set", "default")
    @classmethod
    def _json_values(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            _check_key(key)
            if not _is_json(value):
                raise ValueError(f"{key!r}: not a JSON value; quote it or write a number")
        return values

    @field_validator("strip")
    @classmethod
    def _strip_keys(cls, keys: list[str]) -> list[str]:
        for key in keys:
            _check_key(key)
        return keys

    @model_validator(mode="after")
    def _no_clash(self) -> ParamsConfig:
        for key in self.strip:
            given = [*self.set, *self.default]
            clash = next((k for k in given if _overlap(path_of(k), path_of(key))), None)
            if clash is not None:
                raise ValueError(f"{clash!r} is both given and stripped ({key!r}); keep one")
        both = sorted(self.set.keys() & self.default.keys())
        if both:
            raise ValueError(f"{both[0]!r} is in set and default: set always wins; drop one")
        return self


def _check_key(key: str) -> None:
    parts = path_of(key)
    if not all(parts):
        raise ValueError(f"{key!r}: not a key; write a name, or a dotted path such as a.b")
    if parts[0] in OWNED:
        raise ValueError(
            f"{key!r}: swapgate sets 'model' and 'stream' from the request; drop it "
            "(aliases and upstream_names rename a model)"
        )


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether one path is the other or inside it."""
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def _is_json(value: Any) -> bool:
    """Whether ``value`` (as YAML read it) is JSON: no dates, no NaN or infinity."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


# -- the rule, as applied to each request --------------------------------------------------------

# The fields of the Messages and Responses APIs: given to such a request, they act through its
# translation to chat only (``max_output_tokens`` becomes ``max_tokens``; ``thinking`` is
# dropped), never copied into the chat body as they are.
OWN_FIELDS = {
    "anthropic": frozenset(
        [
            "messages",
            "max_tokens",
            "system",
            "metadata",
            "stop_sequences",
            "temperature",
            "thinking",
            "tool_choice",
            "tools",
            "top_k",
            "top_p",
            "service_tier",
            "container",
            "mcp_servers",
        ]
    ),
    "responses": frozenset(
        [
            "input",
            "instructions",
            "max_output_tokens",
            "max_tool_calls",
            "metadata",
            "parallel_tool_calls",
            "previous_response_id",
            "reasoning",
            "store",
            "temperature",
            "text",
            "tool_choice",
            "tools",
            "top_p",
            "truncation",
            "include",
            "background",
            "conversation",
            "prompt",
            "prompt_cache_key",
            "safety_identifier",
            "service_tier",
            "top_logprobs",
            "user",
            "stream_options",
        ]
    ),
}


@dataclass(frozen=True, slots=True)
class Params:
    """A model's ``params``, as paths, built once per config."""

    set: tuple[tuple[Path, Any], ...]
    default: tuple[tuple[Path, Any], ...]
    strip: tuple[Path, ...]

    @classmethod
    def of(cls, conf: ParamsConfig) -> Params | None:
        """The rule, or None when it changes nothing (an empty ``params:``)."""
        if not (conf.set or conf.default or conf.strip):
            return None
        return cls(
            tuple((path_of(k), v) for k, v in conf.set.items()),
            tuple((path_of(k), v) for k, v in conf.default.items()),
            tuple(path_of(k) for k in conf.strip),
        )

    def apply(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` changed by the rule: a copy where it changes, ``payload`` left as is."""
        body = dict(payload)
        for path in self.strip:
            _remove(body, path)
        for path, value in self.default:
            if not _has(body, path):
                _put(body, path, value)
        for path, value in self.set:
            _put(body, path, value)
        return body

    def into_chat(self, protocol: str) -> Callable[[Chat], Chat]:
        """What the rule does to the chat body a ``protocol`` request is translated to: the
        keys that API does not have, given to chat as to a chat request; strip everywhere."""
        own = OWN_FIELDS.get(protocol, frozenset())
        rest = Params(
            tuple((p, v) for p, v in self.set if p[0] not in own),
            tuple((p, v) for p, v in self.default if p[0] not in own),
            self.strip,
        )
        return rest.apply


class Configured(Protocol):
    @property
    def params(self) -> ParamsConfig | None: ...


def params_for(rules: Mapping[str, Params], model: str, endpoint: str) -> Params | None:
    """The rule for a request to ``model`` at the endpoint labelled ``endpoint``: none for a
    count of tokens, which generates nothing."""
    return None if endpoint == "count_tokens" else rules.get(model)


def by_model(models: Mapping[str, Configured]) -> dict[str, Params]:
    """Each model's rule, for those that have one: the others pay one dict lookup."""
    rules = {name: Params.of(conf.params) for name, conf in models.items() if conf.params}
    return {name: rule for name, rule in rules.items() if rule is not None}


def _has(body: dict[str, Any], path: Path) -> bool:
    node: Any = body
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _put(body: dict[str, Any], path: Path, value: Any) -> None:
    """Set ``path`` to a copy of ``value``, copying each object on the way (the client's are
    left whole) and replacing whatever on it is not an object."""
    node = body
    for part in path[:-1]:
        inner = node.get(part)
        node[part] = dict(inner) if isinstance(inner, dict) else {}
        node = node[part]
    node[path[-1]] = copy.deepcopy(value) if isinstance(value, dict | list) else value


def _remove(body: dict[str, Any], path: Path) -> None:
    if not _has(body, path):
        return
    node = body
    for part in path[:-1]:
        node[part] = dict(node[part])  # the client's object is left whole
        node = node[part]
    del node[path[-1]]
