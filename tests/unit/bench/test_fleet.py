"""bench/fleet.py's pure parts: which models each simulated instance has warm, the gateway's
config, and the targets and tables of its section of docs/benchmarks.md."""

from __future__ import annotations

import pytest

from bench.fleet import COPIES, WANTED, copies, fleet_config, models, warm_plan
from bench.fleet_report import THIS, Figures, change, section, targets

FAST = Figures(0.004, 2.5, 4.0, 23_000, 1.8, 2.5)


@pytest.mark.parametrize(("instances", "count"), [(4, 32), (32, 32), (128, 32), (256, 64)])
def test_the_requested_model_has_as_many_copies_at_every_size(instances: int, count: int) -> None:
    names = models(count)
    plan = warm_plan(instances, names, 2)
    assert len(plan) == instances
    assert all(len(warm) == len(set(warm)) == 2 for warm in plan)
    assert copies(plan, WANTED) == COPIES == 2
    others = [copies(plan, name) for name in names[1:]]
    assert max(others) - min(others) <= 1  # each about as often as the others


def test_the_gateway_config_names_each_instance_with_every_model() -> None:
    config = fleet_config(["http://127.0.0.1:1", "http://127.0.0.1:2"], ["m00", "m01"])
    assert [i["name"] for i in config["instances"]] == ["i000", "i001"]
    assert all(i["models"] == ["m00", "m01"] and i["capacity"] == 2 for i in config["instances"])


def test_targets_read_the_largest_fleet_and_its_warm_ratio_to_a_small_gateway_beside_it() -> None:
    large = Figures(0.05, 3.0, 49.9, 900_000, 19.9, 2.5)
    met = targets({(4, 32): FAST, (256, 64): large})
    assert [ok for _, _, ok in met] == [True, True, True, True]
    assert met[1][1].startswith("1.20×")
    slow = Figures(0.051, 3.01, 50.0, 900_000, 20.0, 2.5)
    assert [ok for _, _, ok in targets({(4, 32): FAST, (256, 64): slow})] == [False] * 4


def test_a_change_shows_both_figures_and_their_ratio() -> None:
    assert change(0.2, 0.05, 3) == "0.200 → 0.050 (0.25×)"
    assert change(0.0, 1.0, 1) == "0.0 → 1.0 (–)"


def test_the_section_compares_with_the_earlier_tree_only_when_it_ran() -> None:
    alone = section({(4, 32): {THIS: FAST}}, 15, 300, "before")
    both = section({(4, 32): {THIS: FAST, "before": FAST}}, 15, 300, "before")
    assert "| 4 × 32 | 0.004 | 1.00 | 2.50 ms | 1.00× | 1.00× | 4.0 ms | 23 kB | 1.8 ms |" in alone
    assert "Against before" not in alone
    assert "| 4 × 32 | 0.004 → 0.004 (1.00×) | 2.50 → 2.50 (1.00×) |" in both
