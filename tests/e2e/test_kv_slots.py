"""The slot books replicas share on a real Redis (swapgate/cluster/kv_slots.py): turns that come
through two replicas at once never get one slot, and the replica that unloads the model saves
every replica's conversations; with Redis gone, each replica keeps its own book."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import respx

from bench.redis import redis_server
from swapgate.cluster.kv_slots import SharedSlots
from swapgate.cluster.store import Cluster
from swapgate.config.loading import parse_config
from swapgate.control.memory.kv import Claim, KvKeeper
from swapgate.metrics import Metrics

pytestmark = pytest.mark.e2e
URL = "http://router"
PROPS = {"model_path": "/m/a.gguf", "default_generation_settings": {"n_ctx": 4096}}


@asynccontextmanager
async def replicas(redis_url: str, root: Path) -> AsyncIterator[list[KvKeeper]]:
    settings = parse_config(
        {
            "instances": [
                {
                    "name": "router",
                    "kind": "llama-router",
                    "url": URL,
                    "models": ["a"],
                    "kv_keep": {"dir": str(root)},
                }
            ]
        }
    )
    clusters = [Cluster(redis_url, name, Metrics()) for name in ("r1", "r2")]
    keepers = [KvKeeper(httpx.AsyncClient(), Metrics(), shared=SharedSlots(c)) for c in clusters]
    for keeper in keepers:
        keeper.configure(settings.instances)
    try:
        yield keepers
    finally:
        for cluster in clusters:
            await cluster.aclose()


def engine(mock: respx.MockRouter, folder: Path) -> list[str]:
    """A router with three slots for model a; returns the files its saves wrote."""
    mock.get("/slots").respond(json=[{"id": n} for n in range(3)])
    mock.get("/props").respond(json=PROPS)
    saved: list[str] = []

    def save(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["filename"]
        saved.append(name)
        (folder / name).write_bytes(b"kv")
        return httpx.Response(200, json={"n_saved": 10})

    mock.post(url__regex=r"/slots/\d+", params={"action": "save"}).mock(side_effect=save)
    return saved


async def test_two_replicas_never_share_a_slot_and_the_unloader_saves_both(tmp_path: Path) -> None:
    with redis_server() as redis, respx.mock(base_url=URL, assert_all_called=False) as mock:
        saved = engine(mock, tmp_path / "router")
        async with replicas(redis.url, tmp_path) as (one, two):
            server = one.server("router", URL, "a")
            first = await one.prepare("router", "a", "c1", None, server)
            assert first is not None
            claims: list[Claim | None] = [
                first,
                *await asyncio.gather(
                    two.prepare("router", "a", "c2", None, server),
                    one.prepare("router", "a", "c3", None, server),
                    two.prepare("router", "a", "c4", None, server),
                ),
            ]
            slots = [c.slot for c in claims if c is not None]
            assert sorted(slots) == [0, 1, 2], f"three slots, each taken once: {slots}"
            again = await two.prepare("router", "a", "c1", None, server)
            assert again is None, "c1's slot is busy on the other replica: the engine picks"
            for claim in claims:
                if claim is not None:
                    await (one if claim.key in ("c1", "c3") else two).finish(claim)
            mine = await two.prepare("router", "a", "c1", None, server)
            assert mine is not None
            assert (mine.slot, mine.new) == (first.slot, False), "its slot, through either replica"
            await two.finish(mine)
            await one.save("router", "a", server)  # the replica that unloads a
        assert sorted(saved) == sorted(f"a--{c.key}.bin" for c in claims if c is not None)


async def test_with_redis_gone_each_replica_keeps_its_own_book(tmp_path: Path) -> None:
    with redis_server() as redis, respx.mock(base_url=URL, assert_all_called=False) as mock:
        engine(mock, tmp_path / "router")
        async with replicas(redis.url, tmp_path) as (one, _):
            redis.kill()
            server = one.server("router", URL, "a")
            first = await one.prepare("router", "a", "c1", None, server)
            second = await one.prepare("router", "a", "c2", None, server)
            assert first is not None
            assert second is not None
            assert (first.shared, first.slot != second.slot) == (False, True)
