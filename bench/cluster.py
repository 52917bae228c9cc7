"""``python -m bench.cluster``: the warm path of a replica on Redis against one alone.

Both in front of the same fixed upstream, measured in alternating rounds in one run (the
machine is noisy: the ratio is the figure). The replica on Redis has a second replica beside
it, so its heartbeats, events and the scheduler's lease all flow while it serves. Writes its
section of docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from pathlib import Path

from bench import load, procs
from bench.redis import redis_server
from bench.sections import replace_section

DOCS = Path(__file__).resolve().parents[1] / "docs"
ROUNDS, SECONDS, CONNECTIONS = 3, 8.0, 16
TARGET = 0.9


def main() -> int:
    rps: dict[str, list[float]] = {"alone": [], "on Redis": []}
    p50: dict[str, list[float]] = {"alone": [], "on Redis": []}
    with ExitStack() as stack:
        upstream = stack.enter_context(procs.fixed_upstream())
        redis = stack.enter_context(redis_server())
        shared = {"SWAPGATE_REDIS_URL": redis.url}
        alone = stack.enter_context(procs.swapgate(upstream.url))
        replica = stack.enter_context(procs.swapgate(upstream.url, shared))
        stack.enter_context(procs.swapgate(upstream.url, shared))  # the other replica
        for proxy in (alone, replica):
            load.wrk(proxy.url, CONNECTIONS, 2)  # warm-up: connections, caches
        for _ in range(ROUNDS):
            for name, proxy in (("alone", alone), ("on Redis", replica)):
                result = load.wrk(proxy.url, CONNECTIONS, SECONDS)
                if result.errors:
                    raise RuntimeError(f"{name}: {result.errors} errors")
                rps[name].append(result.rps)
                p50[name].append(result.p50_ms)
    ratio = statistics.median(rps["on Redis"]) / statistics.median(rps["alone"])
    rows = [
        f"| {name} | {statistics.median(rps[name]):,.0f} | {statistics.median(p50[name]):.2f} ms"
        f" | {', '.join(f'{r:,.0f}' for r in rps[name])} |"
        for name in rps
    ]
    markdown = "\n".join(
        [
            "## Replicas on Redis: the warm path (`python -m bench.cluster`)",
            "",
            f"One replica alone and one of two replicas sharing state through a local redis-server,"
            f" in front of the same fixed upstream; wrk, {CONNECTIONS} connections, {ROUNDS}"
            f" alternating rounds of {SECONDS:.0f} s. The warm path reads no Redis (events arrive"
            " by pub/sub, heartbeats go out every 0.5 s), so the two should serve alike.",
            "",
            "| replica | req/s (median) | p50 (median) | req/s by round |",
            "|---|---|---|---|",
            *rows,
            "",
            f"On Redis / alone: **{ratio:.2f}×** (target ≥ {TARGET}×:"
            f" {'met' if ratio >= TARGET else 'NOT met'}).",
        ]
    )
    replace_section(DOCS / "benchmarks.md", "cluster", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
