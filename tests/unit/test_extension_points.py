"""Each extension point is one list in the code, and the docs name exactly what it holds: the
instance kinds (the drivers), the eviction modes, the metrics."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

from prometheus_client import Counter, Histogram

from swapgate.config.settings import EvictionMode, InstanceKind
from swapgate.drivers import DRIVERS
from swapgate.loop_metrics import LoopCounter
from swapgate.metrics import Declared, Metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Metrics read from live state at scrape time (collectors), or exported only with a Redis.
COLLECTED = {
    "swapgate_swaps_in_progress",
    "swapgate_model_warm",
    "swapgate_queue_depth",
    "swapgate_inflight_requests",
    "swapgate_instance_up",
    "swapgate_cluster_up",
    "swapgate_process_rss_slope_bytes_per_hour",
    "swapgate_ttft_drift_ratio",
    "swapgate_engine_diagnosis",
    "swapgate_load_progress_ratio",
    "swapgate_model_memory_bytes",
    "swapgate_model_failing",
}


def _row(doc: str, key: str) -> str:
    """The configuration reference's table row for ``key``."""
    text = (DOCS / doc).read_text()
    match = re.search(rf"^\| `{key}` \|.*$", text, re.M)
    assert match, f"{doc} has no row for {key}"
    return match.group(0)


def test_every_instance_kind_has_its_driver_and_its_line_in_the_docs() -> None:
    kinds = set(get_args(InstanceKind))
    assert set(DRIVERS) == kinds
    assert all(driver.kind == kind for kind, driver in DRIVERS.items())
    default, allowed = _row("configuration.md", "kind").split("|")[2:4]
    assert set(re.findall(r"`([a-z-]+)`", allowed)) == kinds
    assert default.strip() == "`llama-swap`"


def test_the_eviction_modes_are_the_docs() -> None:
    documented = re.findall(r"`(\w+)` \(", _row("configuration.md", "eviction").split("|")[3])
    assert set(documented) == set(get_args(EvictionMode))


def _declared() -> dict[str, Declared[Any]]:
    return {d.name: d for d in vars(Metrics).values() if isinstance(d, Declared)}


def test_every_metric_declared_is_documented_and_every_documented_one_exists() -> None:
    documented = set(re.findall(r"^\| `(swapgate_\w+)`", (DOCS / "metrics.md").read_text(), re.M))
    counters = (Counter, LoopCounter)
    exposed = {n + "_total" if d.kind in counters else n for n, d in _declared().items()}
    assert exposed - documented == set(), "declared, but not in docs/metrics.md"
    assert documented - exposed - COLLECTED == set(), "in docs/metrics.md, but declared nowhere"


def test_each_metric_is_declared_once_and_built_per_app() -> None:
    declared = [d.name for d in vars(Metrics).values() if isinstance(d, Declared)]
    assert len(declared) == len(set(declared))
    one, two = Metrics(), Metrics()
    assert isinstance(one.requests, LoopCounter)
    assert isinstance(one.swap_duration, Histogram)
    assert one.requests is not two.requests
