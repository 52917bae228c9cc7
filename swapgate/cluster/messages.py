"""What replicas tell each other on the event channel (docs/deploy.md, several replicas): one
frozen dataclass per kind, one ``encode`` and one ``decode``.

On the wire each event is a JSON object with one-letter keys (``t`` its kind, ``r`` the
replica, ``i`` the instance, ``m`` the model, …), as replicas of earlier releases send and
read it: a rolling upgrade mixes both. Whatever does not decode is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SwapStarted:
    """A replica claimed ``instance`` and swaps ``model`` onto it, expected in ``eta`` s."""

    instance: str
    model: str
    eta: float


@dataclass(frozen=True, slots=True)
class SwapDone:
    """That swap ended: ``ok``, how many ``seconds`` it took, the ``backoff`` it left; a
    failed one's ``error`` (the engine's words, as clients may read them) and whose fault it
    was (``blame``: model or instance), which every replica counts towards the model's
    failing (swapgate/control/faults/failing.py)."""

    instance: str
    model: str
    ok: bool
    seconds: float
    backoff: float
    error: str = ""
    blame: str = "model"


@dataclass(frozen=True, slots=True)
class Down:
    """An instance refused a connection: down at once, on every replica."""

    instance: str


@dataclass(frozen=True, slots=True)
class Evicted:
    instance: str
    model: str


@dataclass(frozen=True, slots=True)
class Pinned:
    """An operator's pin, until ``until`` (wall clock); 0: unpinned."""

    instance: str
    model: str
    until: float


@dataclass(frozen=True, slots=True)
class Drained:
    instance: str
    on: bool


@dataclass(frozen=True, slots=True)
class Beat:
    """A replica's requests in flight, per instance and model (its heartbeat)."""

    inflight: dict[str, dict[str, int]]


Event = SwapStarted | SwapDone | Evicted | Pinned | Drained | Beat | Down


@dataclass(frozen=True, slots=True)
class Heard:
    """An event and the replica that sent it."""

    replica: str
    event: Event


def encode(event: Event, replica: str) -> str:
    return json.dumps({**_fields(event), "r": replica})


def _fields(event: Event) -> dict[str, Any]:
    match event:
        case SwapStarted(instance, model, eta):
            return {"t": "swap", "i": instance, "m": model, "eta": eta}
        case SwapDone(instance, model, ok, seconds, backoff, error, blame):
            done = {"t": "done", "i": instance, "m": model, "ok": ok, "s": seconds, "b": backoff}
            return {**done, "e": error, "bl": blame} if not ok else done
        case Down(instance):
            return {"t": "down", "i": instance}
        case Evicted(instance, model):
            return {"t": "evict", "i": instance, "m": model}
        case Pinned(instance, model, until):
            return {"t": "pin", "i": instance, "m": model, "until": until}
        case Drained(instance, on):
            return {"t": "drain", "i": instance, "on": on}
        case Beat(inflight):
            return {"t": "beat", "inflight": inflight}


def decode(raw: object) -> Heard | None:
    """The event in ``raw`` (a message off the channel), or None if it is not one."""
    try:
        data = json.loads(raw) if isinstance(raw, str | bytes) else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        event = _event(data)
    except (KeyError, TypeError, ValueError):
        return None
    return Heard(str(data.get("r", "")), event) if event is not None else None


def _event(data: dict[str, Any]) -> Event | None:
    kind = data.get("t")
    if kind == "beat":
        inflight = data["inflight"]
        if not isinstance(inflight, dict):
            return None
        return Beat({str(i): {str(m): int(n) for m, n in c.items()} for i, c in inflight.items()})
    instance = data["i"]
    if not isinstance(instance, str):
        return None
    model = str(data.get("m", ""))
    if kind == "swap":
        return SwapStarted(instance, model, float(data.get("eta", 0.0)))
    if kind == "done":
        seconds, backoff = float(data.get("s") or 0.0), float(data.get("b") or 0.0)
        error, blame = str(data.get("e") or ""), str(data.get("bl") or "model")
        return SwapDone(instance, model, bool(data.get("ok")), seconds, backoff, error, blame)
    if kind == "down":
        return Down(instance)
    if kind == "evict":
        return Evicted(instance, model)
    if kind == "pin":
        return Pinned(instance, model, float(data.get("until") or 0.0))
    if kind == "drain":
        return Drained(instance, bool(data.get("on")))
    return None
