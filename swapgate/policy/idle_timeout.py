"""Idle unload's rules (docs/configuration.md, "Idle unload: ttl and keep_alive"): how long a
copy may sit idle (its model's ``ttl``, or the ``keep_alive`` its last request asked for, in
Ollama's forms), when it may go, and what a request may ask (``RequestedTimeouts``).

A copy goes once it has been idle its timeout: no request for it in flight (on any replica),
none waiting for it, not pinned, not closing, warm, its instance up and swapping nothing. Idle
counts from the latest of its last request's end, its load and the end of its pin.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from swapgate.config.settings import KeyConfig, Settings
from swapgate.data.lease import Lease
from swapgate.data.snapshot import InstanceView, ModelView
from swapgate.data.warm import WarmState
from swapgate.errors import BadRequest

Reason = Literal["ttl", "keep_alive"]
REASONS: tuple[Reason, ...] = ("ttl", "keep_alive")
# Go's durations, as Ollama reads keep_alive: "5m", "1h30m", "1.5h", "500ms", "-1m"
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"^[+-]?(\d+(?:\.\d*)?|\.\d+)$")
HOW = 'use e.g. "5m", "1h30m", 300 (seconds), 0 (unload after this answer) or -1 (keep it)'


@dataclass(frozen=True, slots=True)
class Timeout:
    """How long a copy may sit idle: ``seconds`` (None: for ever), and who said so."""

    seconds: float | None
    reason: Reason


def parse_keep_alive(value: object) -> float | None:
    """Ollama's ``keep_alive``: seconds idle before the unload (0: right after the answer), or
    None for a negative value (keep it loaded). A number is seconds; a string is a number of
    seconds or a Go duration. Raises ``ValueError`` saying what to send instead."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"not a duration: {value!r}; {HOW}")
    seconds = _number(value) if isinstance(value, int | float) else _text(value.strip())
    if seconds is None or math.isnan(seconds):
        raise ValueError(f"not a duration: {value!r}; {HOW}")
    return None if seconds < 0 or math.isinf(seconds) else seconds


def _number(value: float) -> float | None:
    try:
        return float(value)
    except OverflowError:  # an int beyond float's range: for ever, as a negative is
        return math.inf


def _text(text: str) -> float | None:
    if _NUMBER.match(text):
        return float(text)
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _GO_PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        return None
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in parts)


def timeout_of(ttl: float, asked: float | None, was_asked: bool) -> Timeout:
    """The idle timeout in force: what the last request asked (``was_asked``: it asked,
    ``asked`` None for ever), else the model's ``ttl`` (0: never)."""
    if was_asked:
        return Timeout(asked, "keep_alive")
    return Timeout(ttl if ttl > 0 else None, "ttl")


def idle_since(view: ModelView) -> float:
    """When ``view``'s copy began to sit idle: its last request's end, its load, its pin's end."""
    return max(view.last_used, view.since, view.pinned_until)


def unload_at(
    instance: InstanceView, view: ModelView | None, timeout: Timeout, now: float
) -> float | None:
    """When the copy may be unloaded by idle: a time (``<= now``: at once), or None while
    something holds it (a request, a waiter, a swap; a change of the state says when that
    ends) or its timeout is for ever."""
    if view is None or timeout.seconds is None or held(instance, view):
        return None
    if view.pinned_until > now:  # its idle time starts when the pin ends
        at = view.pinned_until + timeout.seconds
        return at if math.isfinite(at) else None
    return idle_since(view) + timeout.seconds


def held(instance: InstanceView, view: ModelView) -> bool:
    """Whether the copy must stay for now, whatever its timeout: not warm (loading, asleep,
    cold), in flight, awaited, closing for another rule, or its instance down or swapping."""
    if view.state is not WarmState.WARM or view.inflight or view.waiting or view.closing:
        return True
    return not instance.up or instance.swapping is not None or instance.evicting


HEADER = b"x-swapgate-keep-alive"
FIELD = "keep_alive"
Tell = Callable[[str, str, float | None], None]  # (instance, model, seconds): a copy's timeout


@dataclass(frozen=True, slots=True)
class RequestedTimeout:
    """A request's idle timeout for its copy: ``seconds`` (None: keep it loaded); ``in_body``:
    the body carried it (an Ollama upstream gets it back)."""

    seconds: float | None
    in_body: bool


class Body(Protocol):
    """A request as the proxy read it (swapgate/proxy/request.py)."""

    payload: dict[str, Any]
    body: bytes

    @property
    def upload(self) -> object | None: ...


class RequestedTimeouts:
    """Each request's ``keep_alive`` (body) or ``x-swapgate-keep-alive`` (header, which wins),
    read once at admission under one config.

    ``keep_alive`` leaves the body before it goes upstream, except to an instance of ``kind:
    ollama``, whose own API reads it: the OpenAI API answers an unknown field with 400, and vLLM
    warns on every request. A model or key with ``allow_keep_alive: false`` has it ignored, and
    removed for every upstream."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._ollama = frozenset(i.name for i in settings.instances if i.kind == "ollama")

    def read(
        self, headers: list[tuple[bytes, bytes]], request: Body, model: str, key: KeyConfig | None
    ) -> RequestedTimeout | None:
        """What ``request`` for ``model`` asks, with ``keep_alive`` taken out of its body; None
        if it asks nothing or may not (``allow_keep_alive``). Raises ``BadRequest`` for a value
        that is no duration."""
        in_body = request.upload is None and FIELD in request.payload
        value = request.payload.get(FIELD) if in_body else None
        if in_body:
            request.payload = {k: v for k, v in request.payload.items() if k != FIELD}
            request.body = json.dumps(request.payload, separators=(",", ":")).encode()
        in_header = next((v.strip().decode("latin-1") for k, v in headers if k == HEADER), None)
        if in_header is not None:
            value = in_header
        if value is None or not self._allowed(model, key):
            return None
        try:
            return RequestedTimeout(parse_keep_alive(value), in_body)
        except ValueError as exc:
            raise BadRequest(f"{'x-swapgate-keep-alive' if in_header else FIELD}: {exc}") from None

    def _allowed(self, model: str, key: KeyConfig | None) -> bool:
        allowed = self._settings.model_settings(model).allow_keep_alive
        return allowed and (key is None or key.allow_keep_alive)

    def body_for(self, body: bytes, lease: Lease, asked: RequestedTimeout | None) -> bytes:
        """``body`` as it goes to ``lease``: an Ollama instance gets the request's keep_alive."""
        if asked is None or not asked.in_body or not body or lease.kind != "instance":
            return body
        if lease.name not in self._ollama:
            return body
        seconds = -1 if asked.seconds is None else asked.seconds
        return json.dumps({**json.loads(body), FIELD: seconds}, separators=(",", ":")).encode()


def copy_told(
    asked: RequestedTimeout | None, lease: Lease | None
) -> tuple[str, str, float | None] | None:
    """A request that asked is over: the copy that served it (instance, model) and how long it
    may now sit idle; None when it asked nothing, was never leased, or went to a relay."""
    if asked is None or lease is None or lease.kind != "instance":
        return None
    return lease.name, lease.model, asked.seconds
