"""``python -m bench.tuning``: one config for every swap speed (issue 23; ``make bench-swaps``).

The same compressed day — three models on two capacity-1 simulated llama-swap instances, its
times in units of the swap time S — is replayed in real time at S = 1 s, 5 s and 30 s through
swapgate with its default config (timing unset: it follows the measured swaps,
swapgate/policy/timing.py), with the 30 s values that were the defaults before, and with configs
tuned by hand to S (``min_residency`` 0.5, 1 and 2 × S, ``expected_swap`` S, the starvation point at
S). The rule: at every speed the default is within 10% of the best tuned result on swaps and on
p95 (best: the lowest p95 of the tuned configs within 10% of their fewest swaps). Every run of a
table runs side by side; writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench import procs
from bench.replay import ReplayResult, replay, simulators
from bench.sections import replace_section
from bench.trace import Request

DOCS = Path(__file__).resolve().parents[1] / "docs"
MODELS = ("chat", "coder", "batch")
SERVICE = 0.2  # of a swap time: how long one request generates
TOKENS = 20
MAX_WAIT = 120.0  # the default; a client's patience does not scale with the swap time
TUNED = (0.5, 1.0, 2.0)  # min_residency in swap times
TOLERANCE = 1.10


@dataclass(frozen=True)
class Run:
    swap: float  # seconds
    config: str


def day(seed: int, length: float) -> list[Request]:
    """``length`` swap times of a day: chat busy in the morning and quieter after, coding
    steady through the middle, blocks of batch prompts; times in swap times."""
    dice = random.Random(seed)
    requests: list[Request] = []

    def poisson(model: str, rate: float, start: float, end: float) -> None:
        t = start
        while (t := t + dice.expovariate(rate)) < end:
            requests.append(Request(t, model, TOKENS))

    poisson("chat", 2.0, 0, 0.6 * length)
    poisson("chat", 0.4, 0.6 * length, length)
    poisson("coder", 0.3, 0, 0.2 * length)
    poisson("coder", 1.5, 0.2 * length, 0.8 * length)
    poisson("coder", 0.3, 0.8 * length, length)
    for start in (0.15, 0.45, 0.75):  # a block of ten batch prompts within two swap times
        at = start * length
        requests += [Request(at + dice.uniform(0, 2), "batch", TOKENS) for _ in range(10)]
    return sorted(requests, key=lambda r: r.at)


def configs(swap: float) -> dict[str, dict[str, object]]:
    """The routing section of each contender at swap time ``swap``."""
    tuned = {
        f"tuned, residency {k:g} S": {
            "min_residency": f"{k * swap:g}s",
            "expected_swap": f"{swap:g}s",
            "starvation_after": min(0.99, swap / MAX_WAIT),
        }
        for k in TUNED
    }
    before = {"min_residency": "30s", "expected_swap": "30s", "starvation_after": 0.25}
    return {"default": {}, "30 s values (before)": before, **tuned}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tuning", description=__doc__)
    parser.add_argument("--speeds", default="1,5,30", help="swap times, seconds")
    parser.add_argument("--length", type=float, default=40.0, help="trace length, swap times")
    parser.add_argument("--seeds", default="1,2", help="one day per seed; results summed")
    args = parser.parse_args()
    speeds = [float(s) for s in args.speeds.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    traces = {seed: day(seed, args.length) for seed in seeds}
    runs = [(Run(swap, name), seed) for swap in speeds for name in configs(swap) for seed in seeds]
    with ThreadPoolExecutor(len(runs)) as pool:  # replays mostly wait: side by side
        done = pool.map(lambda run: _replay(traces[run[1]], run[0]), runs)
        by_seed = dict(zip(runs, done, strict=True))
    results = {
        run: combined([by_seed[run, seed] for seed in seeds]) for run, _ in runs[:: len(seeds)]
    }
    count = sum(len(t) for t in traces.values())
    markdown = render(results, speeds, args.length, count, seeds)
    replace_section(DOCS / "benchmarks.md", "tuning", markdown)
    print(markdown)
    return 0


def combined(results: list[ReplayResult]) -> ReplayResult:
    """Several days' replays as one: swaps and errors summed, latencies averaged."""
    statuses: dict[int, int] = {}
    for r in results:
        for status, n in r.error_statuses:
            statuses[status] = statuses.get(status, 0) + n
    return ReplayResult(
        swaps=sum(r.swaps for r in results),
        p50_s=statistics.fmean(r.p50_s for r in results),
        p95_s=statistics.fmean(r.p95_s for r in results),
        max_s=max(r.max_s for r in results),
        mean_wait_s=statistics.fmean(r.mean_wait_s for r in results),
        max_wait_s=max(r.max_wait_s for r in results),
        errors=sum(r.errors for r in results),
        error_statuses=tuple(sorted(statuses.items())),
    )


def _replay(trace: list[Request], run: Run) -> ReplayResult:
    scaled = [Request(r.at * run.swap, r.model, r.tokens) for r in trace]
    token_rate = TOKENS / (SERVICE * run.swap)
    with simulators(2, MODELS, run.swap, token_rate) as sims:
        config = {
            "routing": configs(run.swap)[run.config],
            "keepalive": {"early_headers_after": "300s"},  # the wait stays in a header
            "instances": [
                {"name": f"gpu-{i}", "kind": "llama-swap", "url": sim.url, "models": list(MODELS)}
                for i, sim in enumerate(sims)
            ],
        }
        with procs.swapgate_with(config) as gw:
            return replay(gw.url, scaled, sims, speedup=1.0)


def render(
    results: dict[Run, ReplayResult],
    speeds: list[float],
    length: float,
    count: int,
    seeds: list[int],
) -> str:
    lines = [
        "## One config for every swap speed (`make bench-swaps`, `bench/tuning.py`)",
        "",
        f"{len(seeds)} compressed days ({count} requests; seeds {', '.join(map(str, seeds))}) "
        "on three models (chat busy in the morning, "
        "coding through the middle, three blocks of ten batch prompts) on two capacity-1 "
        f"simulated llama-swap instances, {length:g} swap times long, replayed in real time at "
        "three swap times S. Each request generates for 0.2 S. *default* sets no timing: "
        "residency, the expected swap and the starvation point follow the measured swaps "
        "(swapgate/policy/timing.py). *30 s values* are the defaults before (`min_residency` 30 s, "
        "`expected_swap` 30 s, starvation at a quarter of `max_wait`). The *tuned* configs set "
        "`min_residency` to 0.5, 1 or 2 × S, `expected_swap` S and the starvation point at S. "
        "`max_wait` is 120 s everywhere. All runs of the table run side by side. "
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (the end of the run), "
        f"{platform.machine()}, {os.cpu_count()} cores. Swaps and errors are summed over the "
        "days, p50, p95 and the mean wait averaged.",
        "",
        "| swap time | config | swaps | p50 | p95 | mean wait | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, r in results.items():
        lines.append(
            f"| {run.swap:g} s | {run.config} | {r.swaps} | {r.p50_s:.1f} s | {r.p95_s:.1f} s "
            f"| {r.mean_wait_s:.1f} s | {r.errors_text()} |"
        )
    lines += ["", *verdicts(results, speeds), ""]
    return "\n".join(lines)


def verdicts(results: dict[Run, ReplayResult], speeds: list[float]) -> list[str]:
    """Per speed: the default against the best tuned config — the lowest p95 among the tuned
    ones within 10% of the fewest swaps — and against each metric's best on its own."""
    out = []
    for swap in speeds:
        default = results[Run(swap, "default")]
        tuned = {
            run.config: r
            for run, r in results.items()
            if run.swap == swap and "tuned" in run.config
        }
        fewest = min(r.swaps for r in tuned.values())
        name, best = min(
            ((n, r) for n, r in tuned.items() if r.swaps <= TOLERANCE * fewest),
            key=lambda item: item[1].p95_s,
        )
        ok = default.swaps <= TOLERANCE * best.swaps and default.p95_s <= TOLERANCE * best.p95_s
        quickest = min(tuned.values(), key=lambda r: r.p95_s)
        out.append(
            f"- S = {swap:g} s: default {default.swaps} swaps, p95 {default.p95_s:.1f} s; best "
            f"tuned ({name}) {best.swaps} swaps, p95 {best.p95_s:.1f} s: "
            f"{_ratio(default.swaps, best.swaps)} and {_ratio(default.p95_s, best.p95_s)} — "
            + ("within 10%" if ok else "**not within 10%**")
            + f". Against each on its own: the fewest swaps of any tuned config {fewest} "
            f"({_ratio(default.swaps, fewest)}), the lowest p95 {quickest.p95_s:.1f} s "
            f"({_ratio(default.p95_s, quickest.p95_s)}, with {quickest.swaps} swaps)."
        )
    return out


def _ratio(value: float, best: float) -> str:
    return f"{value / best:.2f}×" if best else "–"


if __name__ == "__main__":
    raise SystemExit(main())
