"""The host cache (docs/host-cache.md): what it chooses to keep in RAM, in which order, within
its budget; and, on real files, that it reads in what it chose, lets go only of what it brought
in, and never of a loaded model's weights."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.memory import pages
from swapgate.control.memory.host_cache import MEASURE_SHARE, HostCache
from swapgate.control.state.registry import Registry
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.metrics import Metrics
from swapgate.policy.keep import keep, wanted
from tests.unit.fakes import FakeClock

MIB = 2**20


def test_queued_models_come_first_then_preloads_then_demand_and_loaded_ones_never() -> None:
    order = wanted(
        queued={"late": 20.0, "early": 10.0},
        upcoming=[(300.0, "nightly"), (100.0, "morning")],
        chances={"popular": 0.9, "rare": 0.1, "never": 0.0, "early": 0.5},
        loaded={"morning"},
    )
    assert order == ["early", "late", "nightly", "popular", "rare"]


def test_what_fits_the_budget_in_order_and_a_large_one_is_passed_over() -> None:
    sizes = {"a": 4, "huge": 20, "b": 4, "c": 4}
    assert keep(["a", "huge", "b", "c"], sizes, budget=10) == ["a", "b"]
    assert keep(["unknown", "a"], sizes, budget=10) == ["a"], "no size known: not kept"


def weights(root: Path, name: str, size: int = 4 * MIB) -> Path:
    path = root / f"{name}.gguf"
    path.write_bytes(os.urandom(size))
    os.sync()
    pages.let_go(path)
    return path


def cache(
    root: Path, budget: int | None, read_rate: str = "1GiB/s", size: int = 4 * MIB
) -> tuple[HostCache, Registry, FakeClock]:
    models = {name: {"weights": str(weights(root, name, size))} for name in ("a", "b", "c")}
    settings = parse_config(
        {
            "host_cache": {"budget": budget, "read_rate": read_rate},
            "models": models,
            "instances": [{"name": "x", "url": "http://x", "models": ["a", "b", "c"]}],
        }
    )
    clock = FakeClock(100.0)
    catalog = Catalog(settings)
    registry = Registry(settings.instances, catalog, clock)
    registry.polls.apply_report("x", InstanceReport({}, None), 0)
    return HostCache(settings.host_cache, catalog.weights, registry, Metrics()), registry, clock


@pytest.mark.skipif(pages.resident(Path(__file__)) is None, reason="mincore: Linux only")
async def test_it_reads_in_what_waits_first_within_its_budget(tmp_path: Path) -> None:
    host, registry, clock = cache(tmp_path, budget=9 * MIB)  # two of the three fit
    with registry.queues.queued("c", clock()):  # a request waits for c
        for _ in range(5):  # b is asked for often, a never
            registry.queues.arrived("b")
            clock.advance(10)
        await host.step()
        assert host.kept == ["c", "b"]
        assert host.describe("c") == {"bytes": 4 * MIB, "resident_bytes": 4 * MIB}
        assert host.describe("b") == {"bytes": 4 * MIB, "resident_bytes": 4 * MIB}
        assert host.describe("a") == {"bytes": 4 * MIB, "resident_bytes": 0}
        assert (host.tier("c"), host.tier("a")) == ("cached", "cold")
        assert host.held == 8 * MIB <= 9 * MIB


@pytest.mark.skipif(pages.resident(Path(__file__)) is None, reason="mincore: Linux only")
async def test_it_lets_go_only_of_what_it_brought_in_and_never_of_a_loaded_model(
    tmp_path: Path,
) -> None:
    host, registry, clock = cache(tmp_path, budget=5 * MIB)  # one at a time
    pages.bring_in(tmp_path / "a.gguf", 2**30)  # someone else read a's file: not swapgate's
    with registry.queues.queued("b", clock()):
        await host.step()
    assert host.kept == ["b"]
    with registry.queues.queued("c", clock()):  # now c waits, b no longer
        await host.step()
    assert host.kept == ["c"]
    assert host.describe("b") == {"bytes": 4 * MIB, "resident_bytes": 0}, "its own: let go"
    assert host.describe("a") == {"bytes": 4 * MIB, "resident_bytes": 4 * MIB}, "not its own"
    report = InstanceReport({"c": WarmState.WARM}, None)
    registry.polls.apply_report("x", report, registry.generation("x"))  # c is loaded now
    with registry.queues.queued("b", clock()):
        await host.step()
    assert host.kept == ["b"]
    assert host.describe("c") == {"bytes": 4 * MIB, "resident_bytes": 4 * MIB}, "loaded: kept"
    assert host.held <= 5 * MIB + 4 * MIB  # c's file is the engine's now, b's its own


@pytest.mark.skipif(pages.resident(Path(__file__)) is None, reason="mincore: Linux only")
async def test_a_swap_that_starts_while_it_reads_sees_how_far_the_read_got(
    tmp_path: Path,
) -> None:
    # Three chunks of 8 MiB at 24 MiB/s: the last is read by 0.67 s, the read ends at 1 s.
    host, registry, clock = cache(tmp_path, budget=100 * MIB, read_rate="24MiB/s", size=24 * MIB)
    with registry.queues.queued("c", clock()):
        step = asyncio.create_task(host.step())
        while host.tier("c") != "cached":
            assert not step.done(), "c's file was read whole, and its tier never said so"
            await asyncio.sleep(0.01)
        assert not step.done(), "cached as soon as it was, not when the read returned"
        await step
    assert host.tier("c") == "cached"


async def test_without_a_budget_it_only_measures(tmp_path: Path) -> None:
    host, registry, clock = cache(tmp_path, budget=None)
    with registry.queues.queued("a", clock()):
        await host.step()
    assert host.kept == []
    assert host.describe("a") == {"bytes": 4 * MIB, "resident_bytes": 0}


@pytest.mark.skipif(pages.resident(Path(__file__)) is None, reason="mincore: Linux only")
async def test_it_measures_only_models_not_loaded_and_never_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, registry, clock = cache(tmp_path, budget=5 * MIB)
    measured: list[tuple[str, bool]] = []
    real = pages.resident

    def resident(path: Path) -> int | None:
        on_loop = threading.current_thread() is threading.main_thread()
        measured.append((path.name, on_loop))
        return real(path)

    monkeypatch.setattr(pages, "resident", resident)
    with registry.queues.queued("b", clock()):
        await host.step()  # b is read in, and measured after
    assert {name for name, _ in measured} == {"a.gguf", "b.gguf", "c.gguf"}
    report = InstanceReport({"a": WarmState.WARM}, None)
    registry.polls.apply_report("x", report, registry.generation("x"))  # a is loaded now
    measured.clear()
    with registry.queues.queued("c", clock()):
        await host.step()  # c read in, b let go
    assert "a.gguf" not in {name for name, _ in measured}, "a loaded model's: no decision"
    assert {"b.gguf", "c.gguf"} <= {name for name, _ in measured}
    assert not any(on_loop for _, on_loop in measured), "mincore never on the event loop"
    assert host.describe("a") == {"bytes": 4 * MIB, "resident_bytes": 0}, "its last figure"


async def test_it_measures_less_often_as_measuring_takes_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host, _, _ = cache(tmp_path, budget=None)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            raise asyncio.CancelledError

    monkeypatch.setattr("swapgate.control.memory.host_cache.asyncio.sleep", sleep)
    costs = iter([0.001, 0.5])  # 20 GB of weights, then 2.5 TB's worth

    def measure(loaded: set[str]) -> None:
        host.measured_in = next(costs)

    monkeypatch.setattr(host, "_measure", measure)
    with pytest.raises(asyncio.CancelledError):
        await host.run()
    assert pauses == [1.0, pytest.approx(0.5 / MEASURE_SHARE)]
