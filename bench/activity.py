"""The warm path with every default, with activity (and affinity) off, and the bare passthrough.

Throughput, p99 and CPU per request, side by side.

Three gateways in front of one fixed upstream (nginx answering every POST with one completion),
one with every default (a row per request in its SQLite file), one with
``activity.enabled: false``, one with prefix affinity off as well (``affinity_slack: 0``; with
one copy of the model no conversation key is computed anyway), and the bare Starlette+aiohttp
passthrough (the floor); wrk loads them in turn, several rounds each, so that the machine's
noise falls on all four.
``python -m bench.activity`` writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.load import WrkResult, wrk
from bench.procs import fixed_upstream, passthrough, swapgate_with
from bench.sections import replace_section

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONNECTIONS = 16
ADMIN = "bench-activity-admin"


def _config(upstream: str, activity: dict[str, object], **routing: object) -> dict[str, object]:
    return {
        "server": {"admin_token_env": "BENCH_ADMIN_TOKEN"},
        "routing": {"poll_interval": "5s", **routing},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
        "activity": activity,
    }


def _rows(url: str) -> int:
    """How many rows the log holds now (the newest page's ids count them)."""
    headers = {"authorization": f"Bearer {ADMIN}"}
    page = httpx.get(f"{url}/admin/activity?limit=1", headers=headers, timeout=10).json()
    return int(page["rows"][0]["id"]) if page["rows"] else 0


# The contenders, in the order each round loads them
NAMES = {
    "passthrough": "bare passthrough (the floor)",
    "on": "swapgate, every default (activity log on)",
    "off": "swapgate, `activity.enabled: false`",
    "bare": "swapgate, activity off and `routing.affinity_slack: 0`",
}


@dataclass
class Cpu:
    """CPU seconds a contender spent under load: all of it, and its first thread's."""

    total: float = 0.0
    main: float = 0.0


def measure(rounds: int, seconds: float) -> tuple[dict[str, list[WrkResult]], dict[str, Cpu]]:
    """wrk's results per round, and the CPU each contender spent, by setting."""
    results: dict[str, list[WrkResult]] = {name: [] for name in NAMES}
    cpu = {name: Cpu() for name in NAMES}
    env = {"BENCH_ADMIN_TOKEN": ADMIN}
    with (
        tempfile.TemporaryDirectory() as scratch,
        fixed_upstream() as upstream,
        passthrough(upstream.url) as floor,
        swapgate_with(_config(upstream.url, {"path": f"{scratch}/a.sqlite3"}), env) as on,
        swapgate_with(_config(upstream.url, {"enabled": False}), env) as off,
        swapgate_with(_config(upstream.url, {"enabled": False}, affinity_slack=0), env) as bare,
    ):
        gateways = {"passthrough": floor, "on": on, "off": off, "bare": bare}
        for gateway in gateways.values():
            wrk(gateway.url, CONNECTIONS, 2)  # warm up: connections, caches, the JIT-less rest
        for _ in range(rounds):
            for name, gateway in gateways.items():
                total, main = gateway.cpu_seconds(), gateway.main_thread_cpu_seconds()
                results[name].append(wrk(gateway.url, CONNECTIONS, seconds))
                cpu[name].total += gateway.cpu_seconds() - total
                cpu[name].main += gateway.main_thread_cpu_seconds() - main
        answered = sum(r.requests for r in results["on"])
        print(f"rows in the log: {_rows(on.url)} for at least {answered} requests", flush=True)
    return results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    results, cpu = measure(args.rounds, args.seconds)
    rps = {name: statistics.median(r.rps for r in runs) for name, runs in results.items()}
    p99 = {name: statistics.median(r.p99_ms for r in runs) for name, runs in results.items()}
    errors = sum(r.errors for runs in results.values() for r in runs)
    served = {name: sum(r.requests for r in runs) for name, runs in results.items()}
    total = {name: cpu[name].total / served[name] * 1e6 for name in NAMES}  # µs a request
    main = {name: cpu[name].main / served[name] * 1e6 for name in NAMES}
    for name in results:
        print(name, [round(r.rps) for r in results[name]], [r.p99_ms for r in results[name]])
    print("CPU per request (µs):", {n: round(v, 1) for n, v in total.items()})
    speed, tail = rps["on"] / rps["off"], p99["on"] / p99["off"]
    floor = rps["passthrough"]
    rows = "\n".join(
        f"| {label} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | {p99[name]:.1f} |"
        f" {total[name]:.0f} | {main[name]:.0f} |"
        for name, label in NAMES.items()
    )
    log_cost = total["on"] - total["off"]
    on_loop = main["on"] - main["off"]
    replace_section(
        DOCS / "benchmarks.md",
        "activity",
        f"""
## The warm path: every default, activity off, the floor (`python -m bench.activity`)

swapgate in front of a fixed upstream (nginx), wrk with {CONNECTIONS} connections, {args.rounds}
rounds of {args.seconds:g} s on each in turn, one run on this 2-core machine; medians of the
rounds. The floor is a bare Starlette app forwarding with aiohttp (bench/passthrough.py).
CPU is the process's per request, and of that its first thread's: the event loop's.

| contender | requests/s | × passthrough | p99 (ms) | CPU a request (µs) | on the loop (µs) |
|---|---|---|---|---|---|
{rows}

With every default on, swapgate serves **{rps["on"] / floor:.2f}×** the passthrough (target:
0.9×); with the activity log off, **{rps["off"] / floor:.2f}×**; with prefix affinity off too,
**{rps["bare"] / floor:.2f}×** (one copy of the model: no conversation key is computed either
way). The log costs throughput **{speed:.2f}×**, p99 **{tail:.2f}×**, and **{log_cost:.0f} µs** of
CPU per request, **{on_loop:.0f} µs** of it on the event loop (the row, the usage read from the
answer's tail, the token counts) and the rest on the log's own thread, which writes the rows
in batches, a few hundred per INSERT; {errors} errors.
""",
    )


if __name__ == "__main__":
    main()
