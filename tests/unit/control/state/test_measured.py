"""Measured memory (docs/memory.md, "Measured memory"): what a loaded model was read to take
counts for placement when it is larger than its declared size, is kept until its next load,
and is told once per load when it is more than 10% above the declared one."""

from __future__ import annotations

import logging

import pytest

from swapgate.config.catalog import Catalog
from swapgate.config.loading import parse_config
from swapgate.control.state.registry import Registry
from swapgate.data.footprint import Footprint
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.metrics import Metrics
from swapgate.policy.placement import Policy, Serve, Swap, place
from tests.unit.fakes import FakeClock

MiB, GiB = 2**20, 2**30
POLICY = Policy(min_residency=0)


def fleet(*instances: str, memory: str = "24GiB") -> tuple[Registry, FakeClock]:
    """Instances of ``memory`` each serving ``big`` (declared 2 GiB) and ``other`` (20 GiB)."""
    settings = parse_config(
        {
            "instances": [
                {"name": n, "url": f"http://{n}", "memory": memory, "models": ["big", "other"]}
                for n in instances
            ],
            "models": {"big": {"memory": "2GiB"}, "other": {"memory": "20GiB"}},
        }
    )
    clock = FakeClock()
    return Registry(settings.instances, Catalog(settings), clock), clock


def poll(registry: Registry, name: str, warm: list[str], measured: dict[str, int]) -> None:
    """A poll of ``name``: ``warm`` running, each of ``measured`` read at its resident size."""
    running = dict.fromkeys(warm, WarmState.WARM)
    readings = {m: Footprint(b, "rss") for m, b in measured.items()}
    report = InstanceReport(running, None, measured=readings)
    registry.polls.apply_report(name, report, registry.generation(name))


def test_a_measured_figure_larger_than_declared_is_what_placement_counts() -> None:
    registry, _ = fleet("gpu")
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})
    gpu = registry.snapshot().instance("gpu")
    assert gpu.sizes["big"] == 9 * GiB, "measured 9 GiB over the declared 2 GiB"
    assert gpu.used == 9 * GiB
    assert not gpu.fits("other"), "2 + 20 GiB would fit 24 GiB; 9 + 20 GiB does not"


def test_a_smaller_measured_figure_leaves_the_declared_one() -> None:
    registry, _ = fleet("gpu")
    poll(registry, "gpu", ["big"], {"big": 1 * GiB})
    assert registry.snapshot().instance("gpu").sizes["big"] == 2 * GiB


def test_nothing_measured_leaves_the_declared_size_alone() -> None:
    registry, _ = fleet("gpu")
    poll(registry, "gpu", ["big"], {})
    gpu = registry.snapshot().instance("gpu")
    assert gpu.sizes == {"big": 2 * GiB, "other": 20 * GiB}
    assert gpu.fits("other")


def test_placement_makes_room_for_a_model_that_fits_only_by_the_declared_figure() -> None:
    registry, clock = fleet("gpu")
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})
    clock.advance(60)
    decision = place("other", registry.snapshot(), POLICY)
    assert decision == Swap("gpu", ("big",)), "by the declared 2 GiB it would load beside it"


def test_placement_goes_elsewhere_rather_than_beside_a_model_measured_too_large() -> None:
    registry, clock = fleet("gpu-a", "gpu-b")
    poll(registry, "gpu-a", ["big"], {"big": 9 * GiB})
    poll(registry, "gpu-b", [], {})
    clock.advance(60)
    assert place("other", registry.snapshot(), POLICY) == Swap("gpu-b")
    assert place("big", registry.snapshot(), POLICY) == Serve("gpu-a")


def test_the_figure_is_the_largest_reading_of_a_load_and_outlives_its_unload() -> None:
    registry, clock = fleet("gpu")
    poll(registry, "gpu", ["big"], {"big": 5 * GiB})
    poll(registry, "gpu", ["big"], {"big": 7 * GiB})
    poll(registry, "gpu", ["big"], {"big": 6 * GiB})
    assert registry.sizes("gpu")["big"]["measured"] == 7 * GiB
    poll(registry, "gpu", [], {})  # unloaded: kept, so that its next load is placed by it
    assert registry.sizes("gpu")["big"]["measured"] == 7 * GiB
    assert registry.snapshot().instance("gpu").sizes["big"] == 7 * GiB
    clock.advance(10)
    poll(registry, "gpu", ["big"], {"big": 3 * GiB})  # a new load: its own reading replaces
    assert registry.sizes("gpu")["big"] == {
        "estimate": 2 * GiB,
        "measured": 3 * GiB,
        "measured_by": "rss",
        "placed_by": 3 * GiB,
    }


def test_a_reading_before_the_registry_holds_the_model_warm_waits_for_the_next() -> None:
    registry, _ = fleet("gpu")
    registry.swap_marks.begin_swap("gpu", "big", 60.0)  # loading: the swap settles it, not the poll
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})
    assert "measured" not in registry.sizes("gpu")["big"]


def test_measured_above_declared_is_told_once_per_load_with_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry, clock = fleet("gpu")
    caplog.set_level(logging.WARNING, "swapgate.memory")
    poll(registry, "gpu", ["big"], {"big": 2 * GiB + 100 * MiB})  # under 10% above: quiet
    assert caplog.records == []
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})
    poll(registry, "gpu", ["big"], {"big": 10 * GiB})
    [told] = [r.getMessage() for r in caplog.records]
    assert "big on gpu takes 9 GiB" in told
    assert "above its declared 2 GiB" in told
    assert "raise models.big.memory to at least 9 GiB" in told
    poll(registry, "gpu", [], {})
    clock.advance(10)
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})  # the next load: told again
    assert len(caplog.records) == 2


def test_the_metric_rows_name_both_figures() -> None:
    registry, _ = fleet("gpu")
    poll(registry, "gpu", ["big"], {"big": 9 * GiB})
    assert registry.polls.measured() == [("gpu", "big", 9 * GiB, 2 * GiB)]


def test_the_gauge_has_series_for_the_measured_models_alone() -> None:
    registry, _ = fleet("gpu-a", "gpu-b")
    poll(registry, "gpu-a", ["big"], {"big": 9 * GiB})
    metrics = Metrics()
    metrics.watch_memory(registry.polls.measured)
    series = {
        tuple(sample.labels.values()): sample.value
        for family in metrics.registry.collect()
        if family.name == "swapgate_model_memory_bytes"
        for sample in family.samples
    }
    assert series == {("gpu-a", "big", "measured"): 9 * GiB, ("gpu-a", "big", "declared"): 2 * GiB}
    text = metrics.exposition().decode()
    assert text.count("\nswapgate_model_memory_bytes{") == 2, "none for gpu-b, nothing measured"
