"""What the operator's page shows (docs/operations.md, "The dashboard"): the admin API's state
and, beside it, the swaps running with their waiters, the last swaps with why their victims
were chosen, each model's demand by quarter-hour, the placements and thrash, the preload jobs
and, among replicas, which one this is and what the cluster says.

One dict, made at most a few times a second and only while someone watches
(swapgate/server/event_stream.py), from state the gateway keeps anyway: the data plane pays nothing.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.registry import Collector

from swapgate.control.swaps.load_progress import Figure
from swapgate.server.runtime import Runtime
from swapgate.server.state_view import describe_state


def dashboard_state(runtime: Runtime) -> dict[str, Any]:
    state = describe_state(runtime)
    swaps, registry = runtime.coordinator.log, runtime.registry
    for inst in state["instances"]:
        failure = swaps.last_failure(inst["name"])
        inst["failure"] = (
            {"model": failure.model, "error": failure.error or failure.result}
            if failure is not None and inst["backoff_until"] is not None
            else None
        )
    now = time.time()
    for model, info in state["models"].items():
        info["demand"] = runtime.demand.describe(model, now)
    loads = runtime.coordinator.progress
    state["swaps"] = {
        "running": [
            {
                **record.describe(),
                "waiters": registry.traffic.waiting_on(record.instance, record.model),
                # How far it has got, as the person waiting is told (docs/operations.md)
                "figure": _figure(loads.figure(record.instance, record.model)),
            }
            for record in swaps.running()
        ],
        "recent": [record.describe() for record in swaps.records if record.result is not None],
    }
    metrics = runtime.metrics
    state["placements"] = {
        "counts": _counts(metrics.placements, "placement"),
        "thrash": sum(_counts(metrics.thrash, "instance").values()),
    }
    scheduler = runtime.scheduler
    state["jobs"] = scheduler.describe() if scheduler is not None else []
    cluster = runtime.cluster
    state["replica"] = cluster.replica if cluster is not None else None
    state["now"] = now
    return state


def _figure(figure: Figure | None) -> dict[str, Any] | None:
    return {"ratio": round(figure.ratio, 3), "text": figure.text} if figure else None


def _counts(counter: Collector, label: str) -> dict[str, float]:
    """A counter's totals summed by one of its labels (that counter alone is read)."""
    totals: dict[str, float] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = sample.labels.get(label, "")
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals
