"""The conversation keeper (swapgate/control/kv.py) against a stand-in llama-server: slots
assigned per conversation, saved before an unload, restored on the way back; a save or restore
that fails is counted and never stops the request."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import respx

from swapgate.config.loading import parse_config
from swapgate.control.kv import KvKeeper
from swapgate.metrics import Metrics

URL = "http://engine"


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as mock:
        mock.get("/slots").respond(json=[{"id": 0}, {"id": 1}])
        yield mock


def keeper(root: Path) -> tuple[KvKeeper, Metrics]:
    settings = parse_config({"instances": [{
        "name": "node", "kind": "process", "kv_keep": {"dir": str(root), "budget": "1MiB"},
        "commands": {"a": "llama-server -m /m/a.gguf --port ${PORT}"},
    }]})  # fmt: skip
    metrics = Metrics()
    kv = KvKeeper(httpx.AsyncClient(), metrics)
    kv.configure(settings.instances)
    return kv, metrics


async def test_each_conversation_keeps_its_slot_and_is_saved_then_restored(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, metrics = keeper(tmp_path)
    server = kv.server("node", URL, "a")
    saves = api.post("/slots/0", params={"action": "save"}).respond(json={"n_saved": 600})
    api.post("/slots/1", params={"action": "save"}).respond(json={"n_saved": 60})
    assert await kv.prepare("node", "a", "one", server) == 0
    assert await kv.prepare("node", "a", "two", server) == 1
    assert await kv.prepare("node", "a", "one", server) == 0, "its slot again"
    await kv.save("node", "a", server)  # before the unload
    assert saves.calls.last.request.content == b'{"filename":"a--one.bin"}'
    (tmp_path / "node" / "a--one.bin").write_bytes(b"kv")  # what llama-server wrote
    kv.loaded("node", "a")  # back, its slots empty
    restore = api.post("/slots/0", params={"action": "restore"}).respond(json={"n_restored": 600})
    assert await kv.prepare("node", "a", "one", server) == 0
    assert restore.called
    assert (
        metrics.registry.get_sample_value(
            "swapgate_kv_restores_total", {"instance": "node", "model": "a", "result": "ok"}
        )
        == 1
    )
    assert kv.describe("node") == {"count": 1, "bytes": 2}


async def test_a_failed_restore_is_counted_and_the_turn_still_goes(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, metrics = keeper(tmp_path)
    (tmp_path / "node" / "a--one.bin").write_bytes(b"kv")
    api.post("/slots/0", params={"action": "restore"}).respond(400, json={"error": "invalid"})
    assert await kv.prepare("node", "a", "one", kv.server("node", URL, "a")) == 0
    assert (
        metrics.registry.get_sample_value(
            "swapgate_kv_restores_total", {"instance": "node", "model": "a", "result": "failed"}
        )
        == 1
    )


async def test_past_the_budget_the_least_recently_used_files_go(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, _ = keeper(tmp_path)  # budget: 1 MiB
    folder = tmp_path / "node"
    for age, name in enumerate(("old", "mid", "new")):
        path = folder / f"a--{name}.bin"
        path.write_bytes(b"x" * 400_000)
        os.utime(path, (1000 + age, 1000 + age))
    server = kv.server("node", URL, "a")
    await kv.prepare("node", "a", "fresh", server)  # a slot that holds something to save
    api.post("/slots/0", params={"action": "save"}).respond(json={"n_saved": 1})
    await kv.save("node", "a", server)
    assert sorted(p.name for p in folder.iterdir()) == ["a--mid.bin", "a--new.bin"]
