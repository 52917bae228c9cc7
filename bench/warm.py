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
import subprocess
import tarfile
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.load import WrkResult, wrk
from bench.procs import Proc, fixed_upstream, passthrough, swapgate_with
from bench.sections import replace_section

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONNECTIONS = 16


def _config(upstream: str) -> dict[str, object]:
    return {
        "routing": {"poll_interval": "5s"},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
    }


def export(commit: str, into: Path) -> Path:
    """The package as it was at ``commit``, in a folder of its own (its ``PYTHONPATH``)."""
    archive = into / f"{commit}.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), commit, "swapgate"],
        check=True,
    )
    folder = into / commit
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder


def measure(against: list[str], rounds: int, seconds: float) -> dict[str, list[WrkResult]]:
    results: dict[str, list[WrkResult]] = {}
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = stack.enter_context(fixed_upstream())
        config = _config(upstream.url)
        contenders: dict[str, Proc] = {
            "passthrough": stack.enter_context(passthrough(upstream.url))
        }
        contenders["this tree"] = stack.enter_context(swapgate_with(config))
        for commit in against:
            source = export(commit, scratch)
            contenders[commit] = stack.enter_context(swapgate_with(config, source=source))
        for proc in contenders.values():
            wrk(proc.url, CONNECTIONS, 2)  # warm up
        results = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, proc in contenders.items():
                results[name].append(wrk(proc.url, CONNECTIONS, seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], help="an earlier commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    results = measure(args.against, args.rounds, args.seconds)
    rps = {name: statistics.median(r.rps for r in runs) for name, runs in results.items()}
    p99 = {name: statistics.median(r.p99_ms for r in runs) for name, runs in results.items()}
    errors = sum(r.errors for runs in results.values() for r in runs)
    for name, runs in results.items():
        print(name, [round(r.rps) for r in runs], [r.p99_ms for r in runs])
    floor = rps["passthrough"]
    rows = "\n".join(
        f"| {name} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | "
        f"{rps['this tree'] / rps[name]:.2f}× | {p99[name]:.1f} |"
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

| contender | requests/s | × passthrough | this tree × it | p99 (ms) |
|---|---|---|---|---|
{rows}

This tree serves **{rps["this tree"] / floor:.2f}×** the passthrough; {errors} errors.
""",
    )


if __name__ == "__main__":
    main()
