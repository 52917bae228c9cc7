"""bench/fleet.py's section of docs/benchmarks.md: the curve over fleet sizes, the targets
(docs/benchmarks.md, "A fleet of any size"), and this tree against an earlier one."""

from __future__ import annotations

from dataclasses import dataclass

THIS = "this tree"
Fleet = tuple[int, int]  # instances × models on each


@dataclass(frozen=True)
class Figures:
    idle_cores: float  # CPU with nothing asked, in cores
    warm_p50_ms: float  # a warm request's latency, one at a time
    metrics_ms: float
    metrics_bytes: int
    models_ms: float  # GET /v1/models
    beside_ms: float  # the warm p50 of a gateway of 4 of the same instances, in the same run


def targets(curve: dict[Fleet, Figures]) -> list[tuple[str, str, bool]]:
    """Each target, what this tree measured, and whether it is met, at the largest fleet: its
    warm requests against a gateway of 4 of the same instances beside it."""
    largest = max(curve)
    large = curve[largest]
    where = f"{largest[0]} × {largest[1]}"
    ratio = large.warm_p50_ms / large.beside_ms
    return [
        (f"idle CPU at {where} ≤ 0.05 core", f"{large.idle_cores:.3f}", large.idle_cores <= 0.05),
        (
            f"warm p50 at {largest[0]} instances ≤ 1.2× at 4 (beside it, same simulators)",
            f"{ratio:.2f}× ({large.warm_p50_ms:.2f} / {large.beside_ms:.2f} ms)",
            ratio <= 1.2,
        ),
        (f"/metrics at {where} < 50 ms", f"{large.metrics_ms:.1f} ms", large.metrics_ms < 50),
        (f"/v1/models at {where} < 20 ms", f"{large.models_ms:.1f} ms", large.models_ms < 20),
    ]


def change(before: float, after: float, digits: int) -> str:
    """``before → after (ratio×)``: a figure of both trees side by side."""
    ratio = f"{after / before:.2f}×" if before else "–"
    return f"{before:.{digits}f} → {after:.{digits}f} ({ratio})"


def _curve_rows(curve: dict[Fleet, Figures]) -> list[str]:
    first = curve[min(curve)].warm_p50_ms
    rows = [
        "| instances × models | idle CPU (cores) | per instance (millicores) | warm p50"
        " | × 4 instances beside it | × the first fleet | /metrics | /metrics size | /v1/models |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (instances, count), f in sorted(curve.items()):
        rows.append(
            f"| {instances} × {count} | {f.idle_cores:.3f} | {f.idle_cores / instances * 1000:.2f}"
            f" | {f.warm_p50_ms:.2f} ms | {f.warm_p50_ms / f.beside_ms:.2f}×"
            f" | {f.warm_p50_ms / first:.2f}× | {f.metrics_ms:.1f} ms"
            f" | {f.metrics_bytes / 1000:.0f} kB | {f.models_ms:.1f} ms |"
        )
    return rows


def _against_rows(results: dict[Fleet, dict[str, Figures]], label: str) -> list[str]:
    rows = [
        "| instances × models | idle CPU (cores) | warm p50 (ms) | /metrics (ms)"
        " | /metrics (kB) | /v1/models (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for (instances, count), both in sorted(results.items()):
        old, new = both[label], both[THIS]
        rows.append(
            f"| {instances} × {count} | {change(old.idle_cores, new.idle_cores, 3)}"
            f" | {change(old.warm_p50_ms, new.warm_p50_ms, 2)}"
            f" | {change(old.metrics_ms, new.metrics_ms, 1)}"
            f" | {change(old.metrics_bytes / 1000, new.metrics_bytes / 1000, 0)}"
            f" | {change(old.models_ms, new.models_ms, 1)} |"
        )
    return rows


def section(
    results: dict[Fleet, dict[str, Figures]], idle: float, requests: int, label: str
) -> str:
    curve = {fleet: both[THIS] for fleet, both in results.items()}
    lines = [
        "## A fleet of any size: costs as it grows (`python -m bench.fleet`)",
        "",
        "One gateway in front of simulated llama-swap instances (capacity 2, two models warm"
        " on each, every instance serving every model; all simulators in one process,"
        " `swapgate sim --ports`, keeping idle connections open as llama-swap does), one fleet"
        f" after another. Idle CPU: the gateway's over {idle:g}"
        " s with nothing asked (its polls every 5 s alone). Warm p50: the median of"
        f" {requests} chat requests one at a time for a model warm on two instances at every"
        " size, alternating with a gateway of 4 of the same instances beside it (the same"
        " simulators, the same load of the fleet's polls on the machine): their ratio is what"
        " the fleet's size costs the gateway; against the first fleet, the machine's load"
        " counts too. /metrics and /v1/models: the median read. One run on this 2-core"
        " machine; read the ratios.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(f"| {t} | {m} | {'yes' if ok else '**no**'} |" for t, m, ok in targets(curve)),
        "",
        *_curve_rows(curve),
    ]
    if any(label in both for both in results.values()):
        lines += [
            "",
            f"Against {label}, side by side in the same run (both gateways in front of the same"
            " simulators, idle over the same seconds, requests alternating): "
            f"{label} → this tree (this tree / {label}). What changed, and what each label set"
            ' of /metrics costs: docs/architecture.md, "A fleet of any size".',
            "",
            *_against_rows(results, label),
        ]
    return "\n".join(lines)
