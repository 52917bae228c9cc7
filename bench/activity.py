"""The warm path with every default on, with the activity log off, and the bare passthrough:
throughput, p99 and CPU per request, side by side.

Two gateways in front of one fixed upstream (nginx answering every POST with one completion),
one with every default (a row per request in its SQLite file), the other with
``activity.enabled: false``, and the bare Starlette+aiohttp passthrough (the floor); wrk loads
them in turn, several rounds each, so that the machine's noise falls on all three. (Prefix
affinity costs nothing here: with one copy of the model no conversation key is computed.)
``python -m bench.activity`` writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import httpx

from bench.load import WrkResult, wrk
from bench.procs import fixed_upstream, passthrough, swapgate_with
from bench.sections import replace_section

DOCS = Path(__file__).resolve().parents[1] / "docs"
CONNECTIONS = 16
ADMIN = "bench-activity-admin"


def _config(upstream: str, activity: dict[str, object]) -> dict[str, object]:
    return {
        "server": {"admin_token_env": "BENCH_ADMIN_TOKEN"},
        "routing": {"poll_interval": "5s"},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
        "activity": activity,
    }


def _rows(url: str) -> int:
    """How many rows the log holds now (the newest page's ids count them)."""
    headers = {"authorization": f"Bearer {ADMIN}"}
    page = httpx.get(f"{url}/admin/activity?limit=1", headers=headers, timeout=10).json()
    return int(page["rows"][0]["id"]) if page["rows"] else 0


def measure(rounds: int, seconds: float) -> tuple[dict[str, list[WrkResult]], dict[str, float]]:
    """wrk's results per round, and the gateway's CPU time per request (µs), by setting."""
    results: dict[str, list[WrkResult]] = {"passthrough": [], "off": [], "on": []}
    cpu: dict[str, float] = dict.fromkeys(results, 0.0)
    env = {"BENCH_ADMIN_TOKEN": ADMIN}
    with (
        tempfile.TemporaryDirectory() as scratch,
        fixed_upstream() as upstream,
        passthrough(upstream.url) as floor,
        swapgate_with(_config(upstream.url, {"enabled": False}), env) as off,
        swapgate_with(_config(upstream.url, {"path": f"{scratch}/a.sqlite3"}), env) as on,
    ):
        for gateway in (floor, off, on):
            wrk(gateway.url, CONNECTIONS, 2)  # warm up: connections, caches, the JIT-less rest
        for _ in range(rounds):
            for name, gateway in (("passthrough", floor), ("off", off), ("on", on)):
                before = gateway.cpu_seconds()
                results[name].append(wrk(gateway.url, CONNECTIONS, seconds))
                cpu[name] += gateway.cpu_seconds() - before
        answered = sum(r.requests for r in results["on"])
        print(f"rows in the log: {_rows(on.url)} for at least {answered} requests", flush=True)
    per_request = {n: cpu[n] / sum(r.requests for r in results[n]) * 1e6 for n in cpu}
    return results, per_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    results, per_request = measure(args.rounds, args.seconds)
    rps = {name: statistics.median(r.rps for r in runs) for name, runs in results.items()}
    p99 = {name: statistics.median(r.p99_ms for r in runs) for name, runs in results.items()}
    errors = sum(r.errors for runs in results.values() for r in runs)
    for name in results:
        print(name, [round(r.rps) for r in results[name]], [r.p99_ms for r in results[name]])
    speed, tail = rps["on"] / rps["off"], p99["on"] / p99["off"]
    floor = rps["passthrough"]
    names = {
        "passthrough": "bare passthrough (the floor)",
        "on": "swapgate, every default (activity log on)",
        "off": "swapgate, `activity.enabled: false`",
    }
    rows = "\n".join(
        f"| {label} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | {p99[name]:.1f} |"
        f" {per_request[name]:.0f} |"
        for name, label in names.items()
    )
    print("CPU per request (µs):", {n: round(v, 1) for n, v in per_request.items()})
    replace_section(
        DOCS / "benchmarks.md",
        "activity",
        f"""
## The warm path: every default, activity off, the floor (`python -m bench.activity`)

swapgate in front of a fixed upstream (nginx), wrk with {CONNECTIONS} connections, {args.rounds}
rounds of {args.seconds:g} s on each in turn, one run on this 2-core machine; medians of the
rounds. The floor is a bare Starlette app forwarding with aiohttp (bench/passthrough.py).

| contender | requests/s | × passthrough | p99 (ms) | CPU per request (µs) |
|---|---|---|---|---|
{rows}

With every default on, swapgate serves **{rps["on"] / floor:.2f}×** the passthrough (target:
0.9×); with the activity log off, **{rps["off"] / floor:.2f}×**. The log costs throughput
**{speed:.2f}×**, p99 **{tail:.2f}×**, and **{per_request["on"] - per_request["off"]:.0f} µs** of
CPU per request (its process, both threads); {errors} errors. The request path only appends a
tuple to a buffer; the log's own thread writes the rows in batches, a few hundred per INSERT,
and that thread's SQLite work and its turns at the GIL are most of the difference.
""",
    )


if __name__ == "__main__":
    main()
