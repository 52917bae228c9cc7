"""Keep-alive bytes while a request waits (docs/operations.md), so no proxy in front times out.

When the upstream's headers have not arrived ``early_headers_after`` into a request, the
``Pinger`` commits ``200`` with its own headers and then writes one keep-alive every ``interval``:
an SSE comment (Anthropic's ``ping`` event on its endpoints), or a newline before a JSON body.
A streamed chat completion whose client asked for the load's progress (``progress:
reasoning``) gets it instead as chat chunks with ``reasoning_content``, at most one a second and
only when the text changes (comments keep it alive between), then the wait's total before the
engine's first byte. From then on a failure can only be told
in-band, in the endpoint's dialect: one error event, or an error object as the JSON body. The
upstream's bytes, when they come, follow unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from swapgate.config.settings import KeepaliveConfig, KeyConfig, ProgressMode
from swapgate.control.state.registry import Registry
from swapgate.control.swaps.load_progress import Figure
from swapgate.data.lease import Progress
from swapgate.metrics import Metrics
from swapgate.policy import timing
from swapgate.proxy.endpoints import Endpoint
from swapgate.proxy.headers import route_headers
from swapgate.proxy.writer import BodyMode, ResponseWriter
from swapgate.tasks import stop

Figures = Callable[[str, str], Figure | None]  # (instance, model): how far its load has got
PROGRESS_EVERY = 1.0  # seconds between progress lines, at most
log = logging.getLogger("swapgate.keepalive")


def no_figure(instance: str, model: str) -> Figure | None:
    return None


Kind = Literal["comment", "ping", "ndjson", "reasoning", "whitespace"]
T = TypeVar("T", bytes, str)
OPT_OUT_HEADER = b"x-swapgate-keepalive"
PROGRESS_HEADER = b"x-swapgate-progress"  # off | reasoning: what this request is told
_VERBS = {
    "loading": "loading",
    "waking": "waking",
    "queued": "queued for",
    "waiting": "waiting for",
}
_CONTENT_TYPES = {
    "comment": b"text/event-stream",
    "ping": b"text/event-stream",
    "ndjson": b"application/x-ndjson",  # Ollama's streams
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


def progress_mode(
    asked: bytes | None, key: KeyConfig | None, config: KeepaliveConfig
) -> ProgressMode:
    """What a request is told of the load: its own ``x-swapgate-progress``, else its key's
    ``progress``, else its model's (``config``, the model's keep-alive settings)."""
    if asked in (b"off", b"reasoning"):
        return "reasoning" if asked == b"reasoning" else "off"
    if key is not None and key.progress is not None:
        return key.progress
    return config.progress_mode


def plan_keepalive(
    config: KeepaliveConfig,
    *,
    stream: bool,
    endpoint: Endpoint,
    opted_out: bool,
    progress: ProgressMode | None = None,
) -> KeepalivePlan | None:
    """The keep-alive a request gets, or None when it waits silently: an answer that is not
    JSON (audio, plain text) cannot take leading whitespace. ``progress``: what the client asked
    to be told of the load (only a streamed chat completion has a place for it); None: what
    ``config`` says."""
    if opted_out:
        return None
    progress = progress or config.progress_mode
    kind: Kind
    if stream:
        if progress == "reasoning" and endpoint.chat:
            kind = "reasoning"
        elif config.streaming == "off":
            return None
        else:
            kind = endpoint.dialect.ping_kind
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
        figures: Figures = no_figure,
    ) -> None:
        """``figures``: how far a running load has got (swapgate/control/swaps/load_progress.py)."""
        self.plan = plan
        self._figures = figures
        self._told = ""  # the last progress line written
        self._writer = writer
        self._model = model
        self._progress = progress
        self._registry = registry
        self._counter = metrics.keepalives.labels(model, plan.kind)
        self._metrics = metrics  # its fault counter is looked up on a fault, not per request
        self._started = time.monotonic()
        self._chunk_id = f"swapgate-keepalive-{int(self._started * 1000)}"

    async def run(self) -> None:
        await asyncio.sleep(self.plan.early)
        await self.ping_on()

    async def ping_on(self) -> None:
        """From ``early`` on: commit the status, then ping every interval."""
        mode: BodyMode = "whitespace" if self.plan.kind == "whitespace" else "pings"
        await self._writer.start(200, self._headers(), mode)
        if self.plan.kind == "reasoning":
            await self._tell_progress()
        while True:
            await self._writer.write(self._or_plain(self.ping, self._plain()))
            self._counter.inc()
            await asyncio.sleep(self.plan.interval)

    async def _tell_progress(self) -> None:
        """A line whenever the progress text changes, at most one a second; a comment every
        ``interval`` while it does not."""
        quiet = 0.0
        while True:
            text = self._or_plain(self.progress_text, self._told)
            if text != self._told:
                self._told = text
                await self._writer.write(self._reasoning(text))
                quiet = 0.0
            elif quiet >= self.plan.interval:
                await self._writer.write(b": swapgate waiting\n\n")
                quiet = 0.0
            self._counter.inc()
            await asyncio.sleep(PROGRESS_EVERY)
            quiet += PROGRESS_EVERY

    def _or_plain(self, line: Callable[[], T], plain: T) -> T:
        """``line()``, or ``plain`` where reading the live state for it fails (a bug of ours):
        the wait goes on with plain keep-alives, the fault logged and counted."""
        try:
            return line()
        except Exception:
            self._metrics.internal_errors.labels("keepalive").inc()
            log.exception("a keep-alive line for %s failed; a plain one went out", self._model)
            return plain

    def last_words(self) -> bytes:
        """What goes out just before the engine's first byte: the wait's total, to a client
        that was told the progress."""
        if not self._told:
            return b""
        waited = time.monotonic() - self._started
        return self._reasoning(f"{self._model} answers after {waited:.1f} s.")

    def progress_text(self) -> str:
        """Where the request stands, with a real figure where a load runs."""
        state, instance = self._progress.state, self._progress.instance or "an instance"
        if state in ("loading", "waking"):
            figure = self._figures(instance, self._model)
            verb = "Waking" if state == "waking" else "Loading"
            told = f": {figure.text}" if figure is not None else "…"
            return f"{verb} {self._model} on {instance}{told}"
        if state == "queued":
            waiting = self._registry.queues.depths().get(self._model, 1)
            ahead = f", {waiting - 1} ahead" if waiting > 1 else ""
            return f"Queued for {self._model} on {instance}{ahead}…"
        if state == "waiting":
            return f"{self._model} on {instance} reads the prompt…"
        return f"Finding a place for {self._model}…"

    def _plain(self) -> bytes:
        """A keep-alive that reads nothing of the live state."""
        if self.plan.kind == "whitespace":
            return b"\n"
        if self.plan.kind == "ndjson":
            return self._writer.dialect.ping("waiting")
        return b": swapgate waiting\n\n"

    def ping(self) -> bytes:
        if self.plan.kind == "whitespace":
            return b"\n"
        if self.plan.kind == "reasoning":
            return self._reasoning(self.progress_text())
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

    def _reasoning(self, text: str) -> bytes:
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


class Pinging:
    """A running ``Pinger``: stopped at the upstream's first byte (or the request's end)."""

    def __init__(self, pinger: Pinger) -> None:
        """Nothing runs until ``early``: a timer, not a task, so that a warm answer (most of
        them) costs no task to start, cancel and await."""
        self.pinger = pinger
        self._task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = loop.call_later(pinger.plan.early, self._begin)

    def _begin(self) -> None:
        self._timer = None
        self._task = asyncio.create_task(self.pinger.ping_on())

    async def stop(self) -> bytes:
        """Stop it (once); its last words, if any, to write before the upstream's first byte."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            return b""
        if self._task is None:
            return b""
        await stop(self._task)
        self._task = None
        return self.pinger.last_words()
