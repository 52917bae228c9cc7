"""The warm path of this tree against earlier commits and the bare passthrough, side by side.

Each contender serves one model on one fixed upstream (nginx answering every POST with one
completion), every default on; wrk loads them in turn, several rounds each, so the machine's
noise falls on all. An earlier commit runs from its own export (``git archive``) in this tree's
virtual environment. ``python -m bench.warm --against 1877322 --against ad1c5f6`` writes its
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.load import WrkResult, wrk
from bench.procs import Proc, export, fixed_upstream, passthrough, swapgate_with
from bench.sections import replace_section

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONNECTIONS = 16


def config_for(upstream: str) -> dict[str, object]:
    return {
        "routing": {"poll_interval": "5s"},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
    }


@dataclass(frozen=True)
class Round:
    load: WrkResult
    cpu_us: float  # the server process's CPU per request served, in microseconds


def measure(against: list[str], rounds: int, seconds: float) -> dict[str, list[Round]]:
    """Each contender's rounds; its CPU per request is the figure the machine's noise moves
    least (wrk, nginx and the server share two cores, so requests per second also follow
    whoever else runs)."""
    results: dict[str, list[Round]] = {}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = stack.enter_context(fixed_upstream())
        config = config_for(upstream.url)
        contenders: dict[str, Proc] = {
            "passthrough": stack.enter_context(passthrough(upstream.url))
        }
        contenders["this tree"] = stack.enter_context(swapgate_with(config))
        for commit in against:
            source = export(commit, scratch / commit)
            contenders[commit] = stack.enter_context(swapgate_with(config, source=source))
        for proc in contenders.values():
            wrk(proc.url, CONNECTIONS, 2)  # warm up
        results = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, proc in contenders.items():
                cpu = proc.cpu_seconds()
                load = wrk(proc.url, CONNECTIONS, seconds)
                spent = (proc.cpu_seconds() - cpu) / max(1, load.requests) * 1e6
                results[name].append(Round(load, spent))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], help="an earlier commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    results = measure(args.against, args.rounds, args.seconds)
    rps = {name: statistics.median(r.load.rps for r in runs) for name, runs in results.items()}
    p99 = {name: statistics.median(r.load.p99_ms for r in runs) for name, runs in results.items()}
    cpu = {name: statistics.median(r.cpu_us for r in runs) for name, runs in results.items()}
    errors = sum(r.load.errors for runs in results.values() for r in runs)
    for name, runs in results.items():
        print(name, [round(r.load.rps) for r in runs], [round(r.cpu_us) for r in runs])
    floor = rps["passthrough"]
    rows = "\n".join(
        f"| {name} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | "
        f"{rps['this tree'] / rps[name]:.2f}× | {cpu[name]:.0f} | "
        f"{cpu[name] / cpu['passthrough']:.2f}× | {p99[name]:.1f} |"
        for name in results
    )
    replace_section(
        DOCS / "benchmarks.md",
        "warm",
        f"""
## The warm path against earlier commits (`python -m bench.warm`)

One model on one fixed upstream (nginx), every default on; wrk with {CONNECTIONS} connections,
{args.rounds} rounds of {args.seconds:g} s on each contender in turn, one run on this 2-core
machine, medians of the rounds. An earlier commit runs from its own `git archive`.

| contender | req/s | × passthrough | this tree × it | CPU µs/req | CPU × passthrough | p99 ms |
|---|---|---|---|---|---|---|
{rows}

This tree serves **{rps["this tree"] / floor:.2f}×** the passthrough's requests per second;
its server process spends {cpu["this tree"] / cpu["passthrough"]:.2f}× the passthrough's CPU on a
request (the steadier figure on this shared machine); {errors} errors.
""",
    )


if __name__ == "__main__":
    main()
