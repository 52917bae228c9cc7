"""The conversation keeper (swapgate/control/memory/kv/) against a stand-in llama-server: slots
claimed atomically per conversation, busy slots left alone, saved before an unload (most
recently used first, within the budget and save_timeout), restored on the way back only into
the engine that made the file and only for the client key that made it; a save or restore that
fails is counted and never stops the request."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from swapgate.config.loading import parse_config
from swapgate.control.memory.kv import KvKeeper, Server, SlotBook, TurnSlots
from swapgate.control.memory.kv.files import IDENTITY
from swapgate.data.lease import Lease, Upstream
from swapgate.metrics import Metrics
from swapgate.policy.conversation import scoped
from tests.unit.fakes import FakeClock

URL = "http://engine"
PROPS = {"model_path": "/m/a.gguf", "default_generation_settings": {"n_ctx": 4096}}


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=URL, assert_all_called=False) as mock:
        mock.get("/slots").respond(json=[{"id": n} for n in range(4)])
        mock.get("/props").respond(json=PROPS)
        yield mock


def keeper(
    root: Path, kind: str = "process", clock: FakeClock | None = None, **kv_keep: Any
) -> tuple[KvKeeper, Metrics]:
    node: dict[str, Any] = {
        "name": "node",
        "kind": kind,
        "kv_keep": {"dir": str(root), "budget": "1MiB", **kv_keep},
    }
    if kind == "process":
        node["commands"] = {"a": "llama-server -m /m/a.gguf --port ${PORT}"}
    else:
        node |= {"url": URL, "models": ["a"]}
    metrics = Metrics()
    kv = KvKeeper(httpx.AsyncClient(), metrics, clock or FakeClock())
    kv.configure(parse_config({"instances": [node]}).instances)
    return kv, metrics


def counted(metrics: Metrics, name: str, result: str) -> float | None:
    labels = {"instance": "node", "model": "a", "result": result}
    return metrics.registry.get_sample_value(name, labels)


def saving(api: respx.MockRouter, folder: Path, sizes: dict[int, int] | None = None) -> list[str]:
    """Each save writes its file, as llama-server does; returns the filenames saved, in order."""
    saved: list[str] = []

    def save(request: httpx.Request, slot: str) -> httpx.Response:
        name = json.loads(request.content)["filename"]
        saved.append(name)
        (folder / name).write_bytes(b"k" * (sizes or {}).get(int(slot), 100))
        return httpx.Response(200, json={"n_saved": 10, "n_written": 100})

    api.post(url__regex=r"/slots/(?P<slot>\d+)", params={"action": "save"}).mock(side_effect=save)
    return saved


def test_the_book_claims_idle_slots_and_never_a_busy_one() -> None:
    clock = FakeClock()
    book = SlotBook(2, clock)
    one, two = book.claim("one"), book.claim("two")
    assert one is not None
    assert two is not None
    assert {one.slot, two.slot} == {0, 1}
    assert book.claim("three") is None, "both busy: the engine picks, no slot is taken"
    assert book.claim("one") is None, "its own slot is busy: a second turn at once goes free"
    book.finish(one)
    again = book.claim("one")
    assert again is not None
    assert (again.slot, again.new) == (one.slot, False)


def test_the_least_recently_finished_idle_slot_goes_first_not_the_least_recently_started() -> None:
    clock = FakeClock()
    book = SlotBook(3, clock)
    long, short, other = book.claim("long"), book.claim("short"), book.claim("other")
    assert long is not None
    assert short is not None
    assert other is not None
    clock.advance(1)
    book.finish(short)
    clock.advance(1)
    book.finish(other)
    new = book.claim("new")
    assert new is not None
    assert new.slot == short.slot, "finished first; 'long' still runs"
    assert [key for _, key in book.held()] == ["other", "new", "long"], "most recent first"


async def test_concurrent_turns_each_get_their_own_slot_while_restores_run(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, metrics = keeper(tmp_path)
    folder = tmp_path / "node"
    for key in ("one", "two", "three"):
        (folder / f"a--{key}.bin").write_bytes(b"kv")
        (folder / f"a--{key}.bin.identity").write_text(await identity_of(kv))

    async def slow_restore(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)  # the other turns claim meanwhile
        return httpx.Response(200, json={"n_restored": 600})

    api.post(url__regex=r"/slots/\d+", params={"action": "restore"}).mock(side_effect=slow_restore)
    server = kv.server("node", URL, "a")
    claims = await asyncio.gather(
        *(kv.prepare("node", "a", key, None, server) for key in ("one", "two", "three"))
    )
    slots = [c.slot for c in claims if c is not None]
    assert sorted(slots) == [0, 1, 2], f"three conversations, three slots: {slots}"
    assert counted(metrics, "swapgate_kv_restores_total", "ok") == 3
    assert api.get("/slots").call_count == 1, "the engine's slots are asked once per load"


async def identity_of(kv: KvKeeper) -> str:
    """The identity the keeper gives the stand-in engine (as a saved file records it)."""
    book = await kv.slots.book("node", "a", kv.server("node", URL, "a"))
    assert book is not None
    assert book.identity is not None
    return book.identity


async def test_saves_go_most_recently_used_first_and_stop_at_the_budget(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    clock = FakeClock()
    kv, _ = keeper(tmp_path, clock=clock)
    saved = saving(api, tmp_path / "node", sizes=dict.fromkeys(range(4), 600000))
    server = kv.server("node", URL, "a")
    for key in ("old", "mid", "new"):
        claim = await kv.prepare("node", "a", key, None, server)
        assert claim is not None
        clock.advance(1)
        await kv.finish(claim)
    await kv.save("node", "a", server)  # before the unload; budget 1 MiB, 600 kB each
    assert saved == ["a--new.bin", "a--mid.bin"], "the oldest is not written at all"
    assert sorted(p.name for p in (tmp_path / "node").glob("*.bin")) == ["a--new.bin"]


async def test_saving_stops_at_save_timeout(api: respx.MockRouter, tmp_path: Path) -> None:
    kv, metrics = keeper(tmp_path, save_timeout="0.1s")

    async def stuck(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    api.post(url__regex=r"/slots/\d+", params={"action": "save"}).mock(side_effect=stuck)
    server = kv.server("node", URL, "a")
    await kv.prepare("node", "a", "one", None, server)
    await asyncio.wait_for(kv.save("node", "a", server), 2)
    assert counted(metrics, "swapgate_kv_saves_total", "timeout") == 1


async def test_a_file_made_by_another_model_is_never_restored_and_is_removed(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, metrics = keeper(tmp_path)
    server = kv.server("node", URL, "a")
    saving(api, tmp_path / "node")
    claim = await kv.prepare("node", "a", "one", None, server)
    assert claim is not None
    await kv.finish(claim)
    await kv.save("node", "a", server)
    assert (tmp_path / "node" / "a--one.bin").exists()
    api.get("/props").respond(json={**PROPS, "model_path": "/m/other.gguf"})  # a new command
    await kv.loaded("node", "a")
    restore = api.post("/slots/0", params={"action": "restore"}).respond(json={})
    assert await kv.prepare("node", "a", "one", None, server) is not None
    assert not restore.called, "another model's KV is never restored"
    assert counted(metrics, "swapgate_kv_restores_total", "stale") == 1
    assert not list((tmp_path / "node").iterdir()), "the stale file and its identity are gone"


async def test_one_keys_conversation_is_not_restored_for_another_key(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    for shared in (False, True):
        root = tmp_path / str(shared)
        kv, _ = keeper(root, share_across_keys=shared)
        server = kv.server("node", URL, "a")
        saved = saving(api, root / "node")
        claim = await kv.prepare("node", "a", "same-prompt", "alice", server)
        assert claim is not None
        await kv.finish(claim)
        await kv.save("node", "a", server)
        await kv.loaded("node", "a")
        restore = api.post(url__regex=r"/slots/\d+", params={"action": "restore"}).respond(json={})
        restore.reset()
        await kv.prepare("node", "a", "same-prompt", "bob", server)
        assert restore.called is shared, f"share_across_keys: {shared}"
        expected = "same-prompt" if shared else scoped("same-prompt", "alice")
        assert saved == [f"a--{expected}.bin"]


async def test_a_server_without_a_save_path_is_warned_of_once_and_counted(
    api: respx.MockRouter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kv, metrics = keeper(tmp_path)
    api.post(url__regex=r"/slots/\d+", params={"action": "save"}).respond(
        501, json={"error": {"message": "Start it with `--slot-save-path`"}}
    )
    server = kv.server("node", URL, "a")
    await two_turns_saved_twice(kv, server)
    assert counted(metrics, "swapgate_kv_saves_total", "unsupported") == 4
    assert sum("--slot-save-path" in r.getMessage() for r in caplog.records) == 1


async def two_turns_saved_twice(kv: KvKeeper, server: Server) -> None:
    """Conversations "one" and "two" take a turn each, then their slots are saved; twice."""
    for _ in range(2):
        for key in ("one", "two"):
            claim = await kv.prepare("node", "a", key, None, server)
            assert claim is not None
            await kv.finish(claim)
        await kv.save("node", "a", server)


async def test_a_save_path_other_than_kv_keep_dir_is_told_once_with_its_fix(
    api: respx.MockRouter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """llama-swap's commands name --slot-save-path themselves: one that is not kv_keep.dir (a
    subfolder, a container mount) saves where swapgate never looks."""
    kv, metrics = keeper(tmp_path, kind="llama-swap")
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    saving(api, elsewhere)
    server = kv.server("node", URL, "a")
    with respx.mock(base_url=f"{URL}/upstream/a", assert_all_called=False) as engine:
        engine.get("/slots").respond(json=[{"id": n} for n in range(4)])
        engine.get("/props").respond(json=PROPS)
        saving(engine, elsewhere)
        await two_turns_saved_twice(kv, server)
    assert counted(metrics, "swapgate_kv_saves_total", "missing") == 4
    assert counted(metrics, "swapgate_kv_saves_total", "ok") is None, "none of them is usable"
    told = [r for r in caplog.records if "kv_keep.dir" in r.getMessage()]
    assert len(told) == 1, "once, not at every save"
    assert told[0].levelname == "ERROR"
    assert str(tmp_path) in told[0].getMessage()
    assert sorted(os.listdir(elsewhere)) == ["a--one.bin", "a--two.bin"], "the engine saved"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(IDENTITY)], "no mark, no file"


async def test_a_failed_restore_is_counted_and_the_turn_still_goes(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, metrics = keeper(tmp_path)
    (tmp_path / "node" / "a--one.bin").write_bytes(b"kv")
    (tmp_path / "node" / "a--one.bin.identity").write_text(await identity_of(kv))
    api.post("/slots/0", params={"action": "restore"}).respond(400, json={"error": "invalid"})
    claim = await kv.prepare("node", "a", "one", None, kv.server("node", URL, "a"))
    assert claim is not None
    assert claim.slot == 0
    assert counted(metrics, "swapgate_kv_restores_total", "failed") == 1


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
    await kv.prepare("node", "a", "fresh", None, server)  # a slot that holds something to save
    saving(api, folder)
    await kv.save("node", "a", server)
    assert sorted(p.name for p in folder.glob("*.bin")) == [
        "a--fresh.bin",
        "a--mid.bin",
        "a--new.bin",
    ]


async def test_through_llama_swap_the_slots_are_the_models_own_server_upstream(
    tmp_path: Path,
) -> None:
    kv, _ = keeper(tmp_path, kind="llama-swap")
    assert kv.folder("node") == tmp_path, "kv_keep.dir is its commands' --slot-save-path"
    server = kv.server("node", URL, "a")
    with respx.mock(base_url=f"{URL}/upstream/a", assert_all_called=True) as api:
        api.get("/slots").respond(json=[{"id": 0}, {"id": 1}])
        api.get("/props").respond(json=PROPS)
        claim = await kv.prepare("node", "a", "one", None, server)
    assert claim is not None
    assert claim.slot == 0


def test_the_folder_holding_conversations_is_the_owners_alone(tmp_path: Path) -> None:
    keeper(tmp_path)
    assert (tmp_path / "node").stat().st_mode & 0o777 == 0o700


async def test_a_turn_goes_to_its_slot_on_a_kv_keep_instance_and_nowhere_else(
    api: respx.MockRouter, tmp_path: Path
) -> None:
    kv, _ = keeper(tmp_path, kind="llama-router")
    turns = TurnSlots(kv)
    upstream = Upstream(URL, "engine-key")
    lease = Lease("instance", "node", "a", "a", upstream, waited=0.0)
    slotted, claim = await turns.claim(lease, "one", None)
    assert claim is not None
    assert slotted.slot == claim.slot == 0
    assert api.get("/slots").calls.last.request.headers["authorization"] == "Bearer engine-key"
    again, second = await turns.claim(lease, "one", None)
    assert second is None, "its slot is busy with the first turn: the engine picks"
    assert again.slot is None
    await turns.free(claim)
    _, third = await turns.claim(lease, "one", None)
    assert third is not None
    assert third.slot == claim.slot, "the slot came back when the first turn ended"
    elsewhere = [
        Lease("instance", "other", "a", "a", upstream, waited=0.0),  # no kv_keep there
        Lease("relay", "node", "a", "a", upstream, waited=0.0),
    ]
    for other in elsewhere:
        assert await turns.claim(other, "two", None) == (other, None)
    assert await turns.claim(lease, None, None) == (lease, None), "no conversation"
    assert await TurnSlots(None).claim(lease, "two", None) == (lease, None)
