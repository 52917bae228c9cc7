"""What a client key's limits cost the warm path, alone and with replicas on Redis, against an
earlier commit: ``python -m bench.keys --before COMMIT`` writes its section of
docs/benchmarks.md.

Contenders in front of one fixed upstream (nginx answering every POST with one completion and
its usage), each loaded by wrk in turn, several rounds, so that the machine's noise falls on
all: swapgate with no key (the floor), and swapgate with a key that has every limit (rpm, tpm,
concurrency, set too high to refuse) as it was at ``COMMIT`` and as it is, each alone and
counting on a real redis-server. A key with a tpm or a concurrency is settled (its tokens
counted, its slot given back) before its answer's end goes out (docs/keys.md): what that
costs a request is the difference between the two.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.load import WrkResult, wrk
from bench.procs import BENCH_KEY, ROOT, Proc, export, fixed_upstream, swapgate_with
from bench.redis import redis_server
from bench.sections import replace_section

CONNECTIONS = 16
NAMES = {
    "none": "no key (the floor)",
    "before": "a key with every limit, before",
    "after": "a key with every limit, this tree",
    "before, redis": "the same on Redis, before",
    "after, redis": "the same on Redis, this tree",
}


def config(upstream: str, keyed: bool) -> dict[str, Any]:
    instances = [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}]
    key = {
        "name": "bench",
        "sha256": hashlib.sha256(BENCH_KEY.encode()).hexdigest(),
        "rpm": 100_000_000,
        "tpm": 1_000_000_000,
        "concurrency": 100_000,
    }
    return {"instances": instances, **({"auth": {"keys": [key]}} if keyed else {})}


def measure(before: str, rounds: int, seconds: float) -> dict[str, list[tuple[WrkResult, ...]]]:
    """Per contender and round: wrk with ``CONNECTIONS`` connections, then with one."""
    results: dict[str, list[tuple[WrkResult, ...]]] = {name: [] for name in NAMES}
    with ExitStack() as stack:
        earlier = export(before, Path(stack.enter_context(tempfile.TemporaryDirectory())))
        upstream = stack.enter_context(fixed_upstream()).url
        redis = {"SWAPGATE_REDIS_URL": stack.enter_context(redis_server()).url}
        gateways: dict[str, Proc] = {
            "none": stack.enter_context(swapgate_with(config(upstream, keyed=False))),
            "before": stack.enter_context(swapgate_with(config(upstream, True), source=earlier)),
            "after": stack.enter_context(swapgate_with(config(upstream, True))),
            "before, redis": stack.enter_context(
                swapgate_with(config(upstream, True), redis, source=earlier)
            ),
            "after, redis": stack.enter_context(swapgate_with(config(upstream, True), redis)),
        }
        for gateway in gateways.values():
            wrk(gateway.url, CONNECTIONS, 2)  # warm up
        for _ in range(rounds):
            for name, gateway in gateways.items():
                many = wrk(gateway.url, CONNECTIONS, seconds)
                results[name].append((many, wrk(gateway.url, 1, seconds / 2)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6)
    args = parser.parse_args()
    results = measure(args.before, args.rounds, args.seconds)
    rps = {name: statistics.median(r[0].rps for r in runs) for name, runs in results.items()}
    p50 = {name: statistics.median(r[1].p50_ms for r in runs) for name, runs in results.items()}
    errors = sum(r.errors for runs in results.values() for pair in runs for r in pair)
    for name, runs in results.items():
        print(name, [round(r[0].rps) for r in runs], p50[name], flush=True)
    floor = rps["none"]
    rows = "\n".join(
        f"| {label} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | {p50[name]:.2f} |"
        for name, label in NAMES.items()
    )
    alone, shared = (rps[f"after{s}"] / rps[f"before{s}"] for s in ("", ", redis"))
    replace_section(
        ROOT / "docs" / "benchmarks.md",
        "keys",
        f"""
## What a key's limits cost (`python -m bench.keys`)

swapgate with every default in front of a fixed upstream (nginx), wrk with {CONNECTIONS}
connections then with one, {args.rounds} rounds of {args.seconds:g} s on each contender in
turn, one run on this 2-core machine; medians of the rounds. The key has an rpm, a tpm and a
concurrency, all too high to refuse; "before" is commit `{args.before[:10]}`, exported and run
beside this tree, alone and with a real redis-server.

| contender | requests/s @{CONNECTIONS} | × no key | p50 @1 (ms) |
|---|---|---|---|
{rows}

This tree against the commit before: **{alone:.2f}×** alone, **{shared:.2f}×** on Redis;
{errors} errors.
""",
    )


if __name__ == "__main__":
    main()
