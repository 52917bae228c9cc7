"""``python -m bench [--peers litellm] [--quick]``: every scenario, side by side, in one run.

Writes the table to docs/benchmarks.md and the plot to docs/benchmarks.png. Ratios against
contenders measured in the same run are the numbers to read: this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path

from bench import litellm, load, procs
from bench.report import Report

DOCS = Path(__file__).resolve().parents[1] / "docs"
Contender = Callable[[str], AbstractContextManager[procs.Proc]]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--peers", default="", help="comma-separated extra contenders: litellm")
    parser.add_argument("--quick", action="store_true", help="shorter runs, for a smoke test")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else 10.0
    report = Report(started=datetime.now(UTC), machine=_machine())
    contenders: dict[str, Contender] = {
        "passthrough": procs.passthrough,
        "swapgate": procs.swapgate,
    }
    if "litellm" in args.peers.split(","):
        contender = litellm.contender(report.notes)
        if contender is not None:
            contenders["litellm"] = contender
    warm_path(report, contenders, seconds)
    viewers(report, rounds=2 if args.quick else 4, seconds=seconds * 0.6)
    streaming(report, {k: v for k, v in contenders.items() if k != "litellm"}, args.quick)
    memory(report, requests=5_000 if args.quick else 50_000)
    report.write(DOCS / "benchmarks.md", DOCS / "benchmarks.png")
    print(report.markdown())
    return 0


def warm_path(report: Report, contenders: dict[str, Contender], seconds: float) -> None:
    with procs.fixed_upstream() as upstream:
        report.warm["direct"] = _warm_runs(upstream.url, seconds)
        for name, start in contenders.items():
            try:
                with start(upstream.url) as proxy:
                    load.wrk(proxy.url, 16, 2)  # warm-up: connections, caches
                    report.warm[name] = _warm_runs(proxy.url, seconds)
            except RuntimeError as exc:
                report.notes.append(f"{name} skipped: it did not start ({exc})")


def viewers(report: Report, rounds: int, seconds: float) -> None:
    """swapgate alone, with five dashboards connected, and with a client key's checks (scope,
    class, limits), in rounds that rotate which goes first: sequential runs drift more than the
    difference measured."""
    starts = {
        "alone": procs.swapgate,
        "5 viewers": procs.swapgate_watched,
        "a key's scope and limits": procs.swapgate_keyed,
    }
    with procs.fixed_upstream() as upstream:
        for round_ in range(rounds):
            order = list(starts.items())
            shift = round_ % len(order)
            for name, start in order[shift:] + order[:shift]:
                with start(upstream.url) as proxy:
                    load.wrk(proxy.url, 16, 2)
                    rps = load.wrk(proxy.url, 16, seconds).rps
                report.viewers.setdefault(name, []).append(rps)


def _warm_runs(url: str, seconds: float) -> dict[str, load.WrkResult]:
    return {"c16": load.wrk(url, 16, seconds), "c1": load.wrk(url, 1, seconds / 2)}


def streaming(report: Report, contenders: dict[str, Contender], quick: bool) -> None:
    streams, tokens = (64, 100) if quick else (256, 200)
    with procs.simulator(token_rate=50) as sim:
        report.streams["direct"] = (load.streams(sim.url, streams, tokens), None)
        for name, start in contenders.items():
            with start(sim.url) as proxy:
                load.streams(proxy.url, 8, 5)  # warm-up
                before = proxy.cpu_seconds()
                result = load.streams(proxy.url, streams, tokens)
                report.streams[name] = (result, proxy.cpu_seconds() - before)


def memory(report: Report, requests: int) -> None:
    with procs.fixed_upstream() as upstream, procs.swapgate(upstream.url) as proxy:
        load.wrk(proxy.url, 16, 2)
        before = proxy.rss_mb()
        served = 0
        started = time.monotonic()
        while served < requests:
            served += load.wrk(proxy.url, 16, 5).requests
        report.memory = (before, proxy.rss_mb(), served, time.monotonic() - started)


def _machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


if __name__ == "__main__":
    raise SystemExit(main())
