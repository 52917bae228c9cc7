"""``python -m bench.swaps``: swap economics on replayed traces (``make bench-swaps``).

For each seed and instance count: open-loop replays of the trace through a round-robin balancer,
swapgate with ``eviction: lru`` and with ``eviction: demand`` (at its default horizon and at a
shorter one), in front of simulated llama-swap instances; and the offline swap counts of one
instance, round-robin, LRU, Belady's in-order optimum and the exact optimum of any schedule that
may hold requests as long as swapgate's longest wait. Writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench import procs, trace
from bench.replay import (
    LOAD_SECONDS,
    SPEEDUP,
    ReplayResult,
    describe_errors,
    replay,
    simulators,
    swapgate_config,
)
from bench.sections import replace_section

DOCS = Path(__file__).resolve().parents[1] / "docs"
SHORT_HORIZON = 1.5  # swap times: less waiting for more swaps than the default 3


@dataclass(frozen=True)
class Row:
    seed: int
    instances: int
    strategy: str
    offline: int | None
    replayed: ReplayResult | None


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.swaps", description=__doc__)
    parser.add_argument("--seeds", default="1,2,3,4,5,6")
    parser.add_argument("--detail", type=int, default=2, help="seeds shown row by row")
    parser.add_argument("--instances", default="3,4")
    parser.add_argument("--duration", type=float, default=1200.0, help="trace seconds")
    parser.add_argument("--jobs", type=int, default=4, help="replays run side by side")
    parser.add_argument(
        "--short-horizon",
        type=float,
        default=SHORT_HORIZON,
        help="the demand_horizon of the second demand replay, in swap times",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    counts = [int(n) for n in args.instances.split(",")]
    traces = {seed: trace.generate(seed, args.duration) for seed in seeds}
    detail = seeds[: args.detail]
    short = f"demand:{args.short_horizon:g}"
    runs = [(seed, 1, "lru") for seed in detail] + [
        (seed, count, strategy)
        for seed in seeds
        for count in counts
        for strategy in ("round-robin", "lru", "demand", short)
    ]
    with ThreadPoolExecutor(args.jobs) as pool:  # replays mostly wait: they share 2 cores well
        done = pool.map(lambda run: _replay(traces[run[0]], *run[1:]), runs)
        results = dict(zip(runs, done, strict=True))
    rows: list[Row] = []
    for seed in seeds:  # offline scorers after the replays: the solver would steal their CPU
        requests = traces[seed]
        if seed in detail:
            rows.append(
                Row(seed, 1, "one instance", trace.one_instance(requests), results[seed, 1, "lru"])
            )
        for count in counts:
            rows += _compare(seed, count, requests, results, short)
    markdown = render(rows, args.duration, detail)
    plot([r for r in rows if r.seed in detail], DOCS / "benchmarks-swaps.png")
    replace_section(DOCS / "benchmarks.md", "swaps", markdown)
    print(markdown)
    return 0


def _compare(
    seed: int,
    count: int,
    requests: list[trace.Request],
    results: dict[tuple[int, int, str], ReplayResult],
    short: str,
) -> list[Row]:
    demand = results[seed, count, "demand"]
    wait = math.ceil(demand.max_wait_s)
    return [
        Row(
            seed,
            count,
            "round-robin",
            trace.round_robin(requests, count),
            results[seed, count, "round-robin"],
        ),
        Row(seed, count, "LRU, in order", trace.lru(requests, count), None),
        Row(seed, count, "Belady, in order", trace.belady(requests, count), None),
        Row(
            seed,
            count,
            f"optimum, waits ≤ {wait} s",
            trace.optimum(requests, count, wait, LOAD_SECONDS),
            None,
        ),
        Row(seed, count, "swapgate lru", None, results[seed, count, "lru"]),
        Row(seed, count, "swapgate demand", None, demand),
        Row(
            seed,
            count,
            f"swapgate demand, horizon {short.split(':')[1]}",
            None,
            results[seed, count, short],
        ),
    ]


def _replay(requests: list[trace.Request], count: int, strategy: str) -> ReplayResult:
    with simulators(count) as sims:
        if strategy == "round-robin":
            with procs.passthrough(",".join(s.url for s in sims)) as lb:
                return replay(lb.url, requests, sims)
        eviction, _, horizon = strategy.partition(":")
        config = swapgate_config(sims, eviction, float(horizon) if horizon else None)
        with procs.swapgate_with(config) as gw:
            return replay(gw.url, requests, sims)


def render(rows: list[Row], duration: float, detail: list[int]) -> str:
    lines = [
        "## Swap economics (trace replay, `make bench-swaps`)",
        "",
        f"Seeded {duration / 60:.0f}-minute traces of five workloads on eight models "
        "(interactive bursts on two chat models, steady coding traffic, light steady RAG "
        "traffic, blocks of long batch prompts, a long tail of three rarely used models), "
        f"replayed open-loop {SPEEDUP:.0f}× faster through each contender in front of simulated "
        "llama-swap instances (capacity 1, 20 s swaps); latencies are in trace seconds. swapgate "
        "runs with `min_residency` 30 s, `expected_swap` 20 s and `max_wait` 120 s (trace time); "
        "a request still waiting at `max_wait` gets 503 and counts as an error. The replays of "
        "one table run side by side on one machine.",
        "",
        "How to read it: the offline rows count swaps on the same trace with perfect timing. "
        "*LRU, in order* and *Belady, in order* serve every request the moment it arrives, in "
        "order; swapgate does not — it queues requests for a cold model while the instances are "
        "busy and serves the queue together after one swap — so it can need fewer swaps than "
        "the in-order optimum, paid for in waiting. *Belady, in order* is the yardstick the "
        "swap-economics goal names (× Belady); the stricter one is *optimum, waits ≤ N s* "
        "(× optimum): the fewest swaps any schedule needs, however clairvoyant and however it "
        "reorders, if no request waits longer than swapgate's `demand` replay made any request "
        "wait (N), solved exactly as an integer program (`bench/trace.py`, `optimum`). It "
        "relaxes service time and throughput, so it is a lower bound no real gateway reaches. "
        "`demand` runs at its default `demand_horizon` (3 swap times) and at a shorter one, "
        "which trades swaps for waiting. "
        "The one-instance row is the gateway in front of a single instance: it cannot keep up "
        "and sheds load at `max_wait`.",
        "",
        "| seed | instances | strategy | swaps offline | swaps replayed | p50 | p95 | max "
        "| mean wait | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in (r for r in rows if r.seed in detail):
        r = row.replayed
        cells = [
            str(row.seed),
            str(row.instances),
            row.strategy,
            str(row.offline) if row.offline is not None else "–",
        ]
        if r is None:
            cells += ["–"] * 6
        else:
            cells += [
                str(r.swaps),
                f"{r.p50_s:.1f} s",
                f"{r.p95_s:.1f} s",
                f"{r.max_s:.1f} s",
                f"{r.mean_wait_s:.1f} s",
                r.errors_text(),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_verdicts([r for r in rows if r.seed in detail]), ""]
    lines += [*_summary(rows), "", "![swaps and p95 latency](benchmarks-swaps.png)"]
    return "\n".join(lines)


def _errors(results: list[ReplayResult]) -> str:
    statuses: Counter[int] = Counter()
    for result in results:
        statuses.update(dict(result.error_statuses))
    return describe_errors(sorted(statuses.items()))


def _summary(rows: list[Row]) -> list[str]:
    """Every seed and instance count at once: totals of swaps, means of latencies."""
    runs = sorted({(r.seed, r.instances) for r in rows if r.instances > 1})
    seeds = sorted({seed for seed, _ in runs})
    lines = [
        f"All {len(runs)} runs (seeds {', '.join(map(str, seeds))} × "
        f"{', '.join(sorted({str(n) for _, n in runs}))} instances), totals of swaps and means "
        "of the latency columns:",
        "",
        "| strategy | swaps offline | swaps replayed | × Belady | × optimum | mean p95 "
        "| mean wait | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_strategy: dict[str, list[Row]] = {}
    for row in rows:
        if row.instances > 1:
            name = "optimum, any order" if row.strategy.startswith("optimum") else row.strategy
            by_strategy.setdefault(name, []).append(row)
    best = sum(r.offline or 0 for r in by_strategy["optimum, any order"]) or 1
    belady = sum(r.offline or 0 for r in by_strategy["Belady, in order"]) or 1
    for name, group in by_strategy.items():
        replayed = [r.replayed for r in group if r.replayed is not None]
        offline = [r.offline for r in group if r.offline is not None]
        swaps = sum(r.swaps for r in replayed) if replayed else sum(offline)
        cells = [
            name,
            str(sum(offline)) if offline else "–",
            str(sum(r.swaps for r in replayed)) if replayed else "–",
            f"{swaps / belady:.2f}×",
            f"{swaps / best:.2f}×",
        ]
        if replayed:
            cells += [
                f"{statistics.fmean(r.p95_s for r in replayed):.1f} s",
                f"{statistics.fmean(r.mean_wait_s for r in replayed):.1f} s",
                _errors(replayed),
            ]
        else:
            cells += ["–"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r.seed, r.instances) for r in rows if r.instances > 1})
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4), squeeze=False)
    for axis, (seed, count) in zip(axes[0], groups, strict=True):
        chosen = [r for r in rows if r.seed == seed and r.instances == count]
        labels = [r.strategy.split(",")[0].replace("swapgate ", "sg ") for r in chosen]
        swaps = [r.replayed.swaps if r.replayed else (r.offline or 0) for r in chosen]
        colors = ["#dd8452" if r.replayed else "#8c8c8c" for r in chosen]
        axis.bar(labels, swaps, color=colors)
        axis.set_title(f"seed {seed}, {count} instances: swaps")
        axis.tick_params(axis="x", rotation=30)
        for index, row in enumerate(chosen):
            if row.replayed:
                axis.annotate(
                    f"p95 {row.replayed.p95_s:.0f}s",
                    (index, swaps[index]),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    fig.suptitle("grey: offline count on the trace; orange: replayed (p95 in trace seconds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _verdicts(rows: list[Row]) -> list[str]:
    out = []
    for seed, count in sorted({(r.seed, r.instances) for r in rows if r.instances > 1}):
        by = {r.strategy: r for r in rows if r.seed == seed and r.instances == count}
        optimum = next(r for r in by.values() if r.strategy.startswith("optimum")).offline or 1
        belady = by["Belady, in order"].offline or 1
        demand, lru = by["swapgate demand"].replayed, by["swapgate lru"].replayed
        balancer = by["round-robin"].replayed
        assert demand is not None
        assert lru is not None
        assert balancer is not None
        out.append(
            f"- seed {seed}, {count} instances: demand {demand.swaps} swaps = "
            f"{demand.swaps / belady:.2f}× Belady in order ({belady}) and "
            f"{demand.swaps / optimum:.2f}× the optimum of any order ({optimum}); lru "
            f"{lru.swaps} ({lru.swaps / belady:.2f}× Belady); p95 {demand.p95_s:.1f} s (lru "
            f"{lru.p95_s:.1f} s, round-robin {balancer.p95_s:.1f} s)."
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
