"""The operator's files in deploy/ name only metrics swapgate exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.unit.test_metrics import SPEC

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
METRIC = re.compile(r"\bswapgate_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _assert_known(expr: str) -> list[str]:
    names = METRIC.findall(expr)
    unknown = [n for n in names if _base(n) not in SPEC]
    assert not unknown, f"{unknown} in {expr}"
    for name in names:
        kind = SPEC[_base(name)][0]
        if name.endswith(("_bucket", "_sum", "_count")):
            assert kind == "histogram", name
        if name.endswith("_total"):
            assert kind == "counter", name
    return names


def test_every_dashboard_query_names_an_existing_metric() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "swapgate-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert exprs
    named = {_base(n) for expr in exprs for n in _assert_known(expr)}
    assert "swapgate_swap_duration_seconds" in named
    assert "swapgate_model_warm" in named


def test_every_alert_names_an_existing_metric() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"]: r["expr"] for group in rules["groups"] for r in group["rules"]}
    for expr in alerts.values():
        _assert_known(expr)
    covered = " ".join(alerts.values())
    needed = [
        "swapgate_swap_duration_seconds_bucket",
        "swapgate_swaps_total",
        "swapgate_instance_up",
        "swapgate_fallbacks_total",
        "swapgate_queue_depth",
    ]
    assert all(name in covered for name in needed)


def test_the_scrape_config_keeps_swapgates_own_labels() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["metrics_path"] == "/metrics"
    assert "alerts.yml" in config["rule_files"]
