"""``GET /admin/events``: the gateway's state as Server-Sent Events, for the dashboard, the CLI
and scripts (docs/operations.md, "The dashboard").

A viewer first gets a ``snapshot`` (the whole state, swapgate/server/dashboard.py: the
``/admin/state`` document and more), then only what changed: one-fact events (``model``,
``inflight``, ``queue``, ``preload``), ``swap`` (``started``, ``progress``, then ``done``,
``failed`` or ``abandoned``), ``instance`` (one instance whole: up, drained, backoff, its
models and their diagnoses), ``models`` (queues, demand), ``placements``, ``jobs``,
``cluster``, ``keys`` (each key's use on this replica) and ``reload``
(followed by a fresh snapshot). A comment line every ``PING`` keeps proxies from closing a
quiet stream.

One task makes the state for every viewer, only while someone watches, at most every
``COALESCE`` and at least every ``TICK`` (for elapsed times and ETAs). Each viewer has a
bounded queue: one that falls ``QUEUE`` events behind is dropped (its stream ends with a
``dropped`` event; the page reconnects and starts from a snapshot), so a slow viewer never
holds the others, nor the data plane, which never waits on any of this.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Scope

from swapgate.server.connections import SHUTTING_DOWN
from swapgate.server.dashboard import dashboard_state
from swapgate.server.runtime import Runtime
from swapgate.tasks import stop

log = logging.getLogger("swapgate.admin")
QUEUE = 256  # events a viewer may be behind before it is dropped
COALESCE = 0.25  # seconds between two looks at the state, at most
TICK = 1.0  # seconds between two looks, at least
PING = 15.0  # seconds of quiet before a comment line
CLUSTER_EVERY = 5.0  # seconds between two reads of what Redis says of the replicas
Event = tuple[str, Any, bytes]  # kind, data, and the SSE frame, encoded once for every viewer


class Viewer:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue(QUEUE)
        self.dropped = False

    def give(self, event: Event) -> bool:
        """Queue ``event``; False (and dropped) once the viewer is too far behind."""
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(event_of("dropped", {"reason": f"more than {QUEUE} behind"}))
            return False
        return True


class EventStream:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._viewers: set[Viewer] = set()
        self._task: asyncio.Task[None] | None = None
        self._last: dict[str, Any] = {}
        self._configured: object = None
        self._cluster: dict[str, Any] | None = None

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def watch(self) -> Viewer:
        """A new viewer, its snapshot queued."""
        viewer = Viewer()
        state = self._state()
        viewer.give(event_of("snapshot", state))
        self._viewers.add(viewer)
        if self._task is None or self._task.done():
            self._last, self._configured = state, self._runtime.configured
            self._task = asyncio.create_task(self._run(), name="admin events")
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self._viewers.discard(viewer)

    async def aclose(self) -> None:
        for viewer in self._viewers:
            viewer.give(event_of("bye", {}))
        await stop(self._task)

    async def stream(self, viewer: Viewer, scope: Scope) -> AsyncIterator[bytes]:
        """The viewer's events as SSE, until it hangs up, is dropped or the server stops."""
        quiet = 0.0
        try:
            while SHUTTING_DOWN not in scope.get("extensions", {}):
                try:
                    kind, _, frame = await asyncio.wait_for(viewer.queue.get(), TICK)
                except TimeoutError:
                    quiet += TICK
                    if quiet >= PING:
                        quiet = 0.0
                        yield b": ping\n\n"
                    continue
                quiet = 0.0
                if kind == "bye":
                    return
                yield frame
                if kind == "dropped":
                    return
        finally:
            self.leave(viewer)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        cluster_at = 0.0
        while self._viewers:
            await self._runtime.registry.changes.wait(TICK)
            await asyncio.sleep(COALESCE)
            if self._runtime.cluster is not None and loop.time() >= cluster_at:
                cluster_at = loop.time() + CLUSTER_EVERY
                await self._read_cluster()
            try:
                events = self._changes()
            except Exception:  # a bug here must not end every viewer's stream
                log.exception("the dashboard's state could not be made")
                continue
            for viewer in list(self._viewers):
                if not all(viewer.give(event) for event in events):
                    self._viewers.discard(viewer)
                    log.warning("a dashboard viewer fell %d events behind: dropped", QUEUE)

    async def _read_cluster(self) -> None:
        self._cluster = await self._runtime.describe_cluster()

    def _state(self) -> dict[str, Any]:
        state = dashboard_state(self._runtime)
        state["cluster"] = self._cluster
        return state

    def _changes(self) -> list[Event]:
        state, last = self._state(), self._last
        self._last = state
        if self._runtime.configured is not self._configured:
            self._configured = self._runtime.configured
            names = [inst["name"] for inst in state["instances"]]
            return [event_of("reload", {"instances": names}), event_of("snapshot", state)]
        events: list[tuple[str, Any]] = []
        before = {inst["name"]: inst for inst in last.get("instances", [])}
        for inst in state["instances"]:
            if before.pop(inst["name"], None) != inst:
                events.append(("instance", inst))
        events += [("instance", {"name": name, "removed": True}) for name in before]
        for key in ("models", "placements", "jobs", "cluster", "keys"):
            if state.get(key) != last.get(key):
                events.append((key, state[key]))
        events += _swap_events(last.get("swaps", {}), state["swaps"])
        events += _fine(last, state)
        return [event_of(kind, data) for kind, data in events]


def event_of(kind: str, data: Any) -> Event:
    return kind, data, f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _swap_events(last: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each swap that began, moved (its waiters) or ended since the last look."""
    seen = {r["id"]: r for r in last.get("running", [])}
    ended = {r["id"] for r in last.get("recent", [])}
    events: list[tuple[str, Any]] = []
    for record in now["running"]:
        was = seen.get(record["id"])
        if was is None:
            events.append(("swap", _swap(record, "started")))
        elif was != record:
            events.append(("swap", _swap(record, "progress")))
    for record in now["recent"]:
        if record["id"] not in ended:
            events.append(("swap", _swap(record, _ENDED.get(record["result"], "failed"))))
    return events


# How a swap's result is told as its event; ``result`` keeps the precise one.
_ENDED = {
    "ok": "done",
    "failed": "failed",
    "timeout": "failed",
    "abandoned": "abandoned",
    "handed over": "abandoned",
}


def _swap(record: dict[str, Any], event: str) -> dict[str, Any]:
    victims = record["victims"]
    return {
        **record,
        "event": event,
        "duration": record["seconds"],
        "victim": victims[0] if victims else None,
        "why": record["reason"],
    }


def _fine(last: dict[str, Any], state: dict[str, Any]) -> list[tuple[str, Any]]:
    """The one-fact deltas beside the ``instance`` ones: ``model`` (a model's state on an
    instance, and while it loads its progress: elapsed over ETA, an estimate), ``inflight``
    (an instance's count), ``queue`` (a model's depth), ``preload`` (a job ran)."""
    events: list[tuple[str, Any]] = []
    before = {inst["name"]: inst for inst in last.get("instances", [])}
    running = {(r["instance"], r["model"]): r for r in state["swaps"]["running"]}
    for inst in state["instances"]:
        name, was = inst["name"], before.get(inst["name"], {})
        if was.get("inflight") != inst["inflight"]:
            events.append(("inflight", {"instance": name, "count": inst["inflight"]}))
        old = was.get("models", {})
        for model in sorted(set(inst["models"]) | set(old)):
            view, prior = inst["models"].get(model), old.get(model)
            moved = (view or {}).get("state") == "loading"
            if moved or _state(view) != _state(prior):
                swap = running.get((name, model))
                events.append(("model", _model(name, model, view, state, swap)))
    old_models = last.get("models", {})
    for model, info in state["models"].items():
        if old_models.get(model, {}).get("queue") != info["queue"]:
            events.append(("queue", {"model": model, "depth": info["queue"]}))
    ran = {job["name"]: job["last_run"] for job in last.get("jobs", [])}
    for job in state["jobs"]:
        if job["last_run"] is not None and ran.get(job["name"]) != job["last_run"]:
            events.append(("preload", {"job": job["name"], "result": job["last_result"]}))
    return events


def _state(view: dict[str, Any] | None) -> tuple[str, str | None]:
    return (view["state"], view["since"]) if view else ("cold", None)


def _model(
    instance: str,
    model: str,
    view: dict[str, Any] | None,
    state: dict[str, Any],
    swap: dict[str, Any] | None,
) -> dict[str, Any]:
    etas = state["models"].get(model, {}).get("eta_seconds", {})
    eta = swap["eta_seconds"] if swap else etas.get(instance)
    progress = None
    if swap and swap.get("figure"):  # the real figure: the weights read, or the time share
        progress = swap["figure"]["ratio"]
    elif swap and swap["eta_seconds"] > 0:
        progress = round(min(0.99, (state["now"] - swap["started_at"]) / swap["eta_seconds"]), 3)
    return {
        "instance": instance,
        "model": model,
        "state": view["state"] if view else "cold",
        "since": view["since"] if view else None,
        "eta": eta,
        "progress": progress,
    }
