"""What exists once the gateway is up is kept out of the cyclic collector's full scans
(swapgate/server/runtime.py settle_heap; why, in docs/benchmarks.md), and what a reload
replaces is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from swapgate.config.loading import load_config
from swapgate.server.runtime import Runtime
from swapgate.server.serve import YOUNG_ALLOCATIONS, tune_collector


class Cycle:
    """Garbage only the cyclic collector frees."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()  # the rest of the suite runs with a collector that sees everything
    gc.set_threshold(*threshold)


async def test_start_freezes_the_long_lived_heap_and_a_reload_lets_garbage_go(
    tmp_path: Path, thawed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPGATE_STATE_DIR", str(tmp_path / "state"))
    config = tmp_path / "swapgate.yaml"
    config.write_text(yaml.safe_dump({"instances": [{"name": "x", "url": "http://127.0.0.1:9"}]}))
    gc.unfreeze()
    before = gc.get_threshold()
    runtime = Runtime(load_config(config), config)
    await runtime.start()
    try:
        assert gc.get_freeze_count() > 10_000, "the modules, the app and the config are frozen"
        assert gc.get_threshold() == before, "how often it collects is serve()'s to say"
        lingering = Cycle()
        gone = weakref.ref(lingering)
        del lingering
        gc.freeze()  # garbage frozen alongside, as a config a reload replaces would be
        gc.collect()
        assert gone() is not None, "frozen: no full collection scans it"
        await runtime.reload()
        assert gone() is None, "a reload thaws, collects and freezes again"
        assert gc.get_freeze_count() > 10_000
    finally:
        await runtime.aclose()


def test_serving_collects_the_youngest_generation_after_ten_thousand_allocations(
    thawed: None,
) -> None:
    """Not Python's 700: the objects of 16 requests in flight crossed it, and a collection
    that freed nothing ran every ~17 requests (docs/benchmarks.md)."""
    _, middle, old = gc.get_threshold()
    tune_collector()
    assert gc.get_threshold() == (YOUNG_ALLOCATIONS, middle, old)
