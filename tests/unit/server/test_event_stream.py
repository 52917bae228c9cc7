"""The dashboard's event stream in-process (swapgate/server/event_stream.py): a snapshot first, then
only what changed; a viewer that falls behind is dropped while the others go on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from swapgate.config.loading import load_config
from swapgate.server import event_stream
from swapgate.server.event_stream import EventStream, Viewer
from swapgate.server.runtime import Runtime


@pytest.fixture
async def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Runtime]:
    monkeypatch.setenv("SWAPGATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(event_stream, "COALESCE", 0.01)
    config = tmp_path / "swapgate.yaml"
    instances = [{"name": n, "url": "http://127.0.0.1:9", "models": ["a"]} for n in ("x", "y")]
    config.write_text(yaml.safe_dump({"instances": instances}))
    built = Runtime(load_config(config), config)
    yield built
    await built.aclose()


async def next_event(viewer: Viewer) -> tuple[str, object]:
    kind, data, frame = await asyncio.wait_for(viewer.queue.get(), 5)
    assert frame.startswith(f"event: {kind}\ndata: ".encode())
    return kind, data


async def test_a_snapshot_first_then_only_the_instance_that_changed(runtime: Runtime) -> None:
    stream = EventStream(runtime)
    viewer = stream.watch()
    kind, snapshot = await next_event(viewer)
    assert kind == "snapshot"
    assert isinstance(snapshot, dict)
    assert [i["name"] for i in snapshot["instances"]] == ["x", "y"]
    runtime.registry.operator.set_drained("y", True)
    kind, changed = await next_event(viewer)
    assert kind == "instance"
    assert isinstance(changed, dict)
    assert (changed["name"], changed["drained"]) == ("y", True)
    await asyncio.sleep(0.1)
    assert viewer.queue.empty(), "nothing else changed"
    await stream.aclose()


async def test_a_viewer_that_falls_behind_is_dropped_and_the_others_go_on(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_stream, "QUEUE", 4)
    stream = EventStream(runtime)
    slow, quick = stream.watch(), stream.watch()
    got: list[str] = []

    async def read() -> None:
        while True:
            kind, _, _ = await quick.queue.get()
            got.append(kind)

    reader = asyncio.create_task(read())
    for step in range(8):
        runtime.registry.operator.set_drained("x", step % 2 == 0)
        await asyncio.sleep(0.05)
    assert slow.dropped
    assert not quick.dropped
    assert stream.viewers == 1
    left = [slow.queue.get_nowait()[0] for _ in range(slow.queue.qsize())]
    assert left == ["dropped"], "its stream ends saying why, with nothing else queued"
    assert got.count("instance") >= 6, got
    reader.cancel()
    await stream.aclose()


def test_the_one_fact_events_say_what_moved_and_only_that() -> None:
    def state(inflight: int, a: str, depth: int, last_run: str | None) -> dict[str, object]:
        since = "2026-12-04T10:00:00Z"
        return {
            "now": 1000.0,
            "instances": [
                {"name": "x", "inflight": inflight, "models": {"a": {"state": a, "since": since}}}
            ],
            "models": {"a": {"queue": depth, "eta_seconds": {"x": 20.0}}},
            "swaps": {
                "running": [
                    {"instance": "x", "model": "a", "eta_seconds": 20.0, "started_at": 990.0}
                ]
                if a == "loading"
                else []
            },
            "jobs": [{"name": "morning", "last_run": last_run, "last_result": {"ok": True}}],
        }

    assert event_stream._fine(state(1, "warm", 0, None), state(1, "warm", 0, None)) == []
    moved = event_stream._fine(state(1, "cold", 0, None), state(3, "loading", 2, "09:00"))
    assert moved == [
        ("inflight", {"instance": "x", "count": 3}),
        (
            "model",
            {
                "instance": "x",
                "model": "a",
                "state": "loading",
                "since": "2026-12-04T10:00:00Z",
                "eta": 20.0,
                "progress": 0.5,
            },
        ),
        ("queue", {"model": "a", "depth": 2}),
        ("preload", {"job": "morning", "result": {"ok": True}}),
    ]
