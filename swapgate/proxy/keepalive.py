"""Keep-alive bytes while a request waits (docs/operations.md), so no proxy in front times out.

When the upstream's headers have not arrived ``early_headers_after`` into a request, the
``Pinger`` commits ``200`` with its own headers and then writes one keep-alive every ``interval``:
an SSE comment (Anthropic's ``ping`` event on its endpoints), a chat chunk with
``reasoning_content``, or a newline before a JSON body. From then on a failure can only be told
in-band, in the endpoint's dialect: one error event, or an error object as the JSON body. The
upstream's bytes, when they come, follow unchanged.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Literal

from swapgate.config.settings import KeepaliveConfig
from swapgate.control.registry import Registry
from swapgate.data.lease import Progress
from swapgate.metrics import Metrics
from swapgate.policy import timing
from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.headers import route_headers
from swapgate.proxy.writer import BodyMode, ResponseWriter

Kind = Literal["comment", "ping", "reasoning", "whitespace"]
OPT_OUT_HEADER = b"x-swapgate-keepalive"
_VERBS = {
    "loading": "loading", "waking": "waking", "queued": "queued for", "waiting": "waiting for",
}  # fmt: skip
_CONTENT_TYPES = {
    "comment": b"text/event-stream",
    "ping": b"text/event-stream",
    "reasoning": b"text/event-stream",
    "whitespace": b"application/json",
}


@dataclass(frozen=True, slots=True)
class KeepalivePlan:
    kind: Kind
    early: float
    interval: float

    @property
    def is_event_stream(self) -> bool:
        return self.kind != "whitespace"


def plan_keepalive(
    config: KeepaliveConfig, *, stream: bool, endpoint: Endpoint, opted_out: bool
) -> KeepalivePlan | None:
    """The keep-alive a request gets, or None when it waits silently: an answer that is not
    JSON (audio, plain text) cannot take leading whitespace."""
    if opted_out:
        return None
    kind: Kind
    if stream:
        if config.streaming == "off":
            return None
        reasoning = config.streaming == "reasoning" and endpoint.chat
        kind = "reasoning" if reasoning else endpoint.dialect.ping_kind
    else:
        if config.non_streaming == "off" or not endpoint.json_answer:
            return None
        kind = "whitespace"
    return KeepalivePlan(kind, config.early_headers_after, config.interval)


class Pinger:
    """Commits the response early and keeps it alive until stopped."""

    def __init__(
        self,
        plan: KeepalivePlan,
        writer: ResponseWriter,
        model: str,
        progress: Progress,
        registry: Registry,
        metrics: Metrics,
    ) -> None:
        self.plan = plan
        self._writer = writer
        self._model = model
        self._progress = progress
        self._registry = registry
        self._counter = metrics.keepalives.labels(model, plan.kind)
        self._started = time.monotonic()
        self._chunk_id = f"swapgate-keepalive-{int(self._started * 1000)}"

    async def run(self) -> None:
        await asyncio.sleep(self.plan.early)
        mode: BodyMode = "whitespace" if self.plan.kind == "whitespace" else "pings"
        await self._writer.start(200, self._headers(), mode)
        while True:
            await self._writer.write(self.ping())
            self._counter.inc()
            await asyncio.sleep(self.plan.interval)

    def ping(self) -> bytes:
        if self.plan.kind == "whitespace":
            return b"\n"
        if self.plan.kind == "reasoning":
            return self._reasoning_chunk()
        return self._writer.dialect.ping(self._status())

    def _headers(self) -> list[tuple[bytes, bytes]]:
        waited = time.monotonic() - self._started
        return [
            (b"content-type", _CONTENT_TYPES[self.plan.kind]),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            (b"x-swapgate-keepalive", self.plan.kind.encode()),
            # Where the request went, once it went; until then ``pending``: a relay may still
            # answer, or another instance.
            *route_headers(self._progress.route or "pending", waited),
        ]

    def _status(self) -> str:
        instance = self._progress.instance or "an instance"
        verb = _VERBS.get(self._progress.state, "placing")
        eta = self._eta()
        elapsed = math.floor(time.monotonic() - self._started)
        eta_text = f", eta {eta}s" if eta is not None else ""
        return f"{verb} {self._model} on {instance}{eta_text}, elapsed {elapsed}s"

    def _eta(self) -> int | None:
        name = self._progress.instance
        if name is None or self._progress.state == "waiting":
            return None
        snap = self._registry.snapshot()
        view = snap.instance(name)
        if view.swapping is None:
            return None
        swap = view.models.get(view.swapping)
        began = swap.since if swap is not None else snap.now
        return timing.remaining(view.swap_done_by, began, snap.now)

    def _reasoning_chunk(self) -> bytes:
        elapsed = math.floor(time.monotonic() - self._started)
        eta = self._eta()
        instance = self._progress.instance or "an instance"
        verb = "Waking" if self._progress.state == "waking" else "Loading"
        text = f"{verb} {self._model} on {instance}… {elapsed}s"
        if eta is not None:
            text += f" (eta {eta}s)"
        chunk = {
            "id": self._chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self._model,
            "choices": [
                {"index": 0, "delta": {"reasoning_content": text + "\n"}, "finish_reason": None}
            ],
        }
        return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
