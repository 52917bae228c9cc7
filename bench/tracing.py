"""What tracing costs the warm path: off (no endpoint) against the code before tracing existed,
and on, exporting every request's spans to a collector that takes them.

Contenders in front of one fixed upstream (nginx answering every POST with one completion),
loaded in turn by wrk, several rounds each, so that the machine's noise falls on all: the bare
passthrough (the floor); swapgate as it was before tracing (an earlier commit, exported with
``git archive``); this tree with tracing off; this tree with every request traced
(``sample_ratio: 1``) to a collector that answers every export at once (the same nginx: its
200 is all an OTLP exporter reads). ``python -m bench.tracing --before COMMIT`` writes its
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.load import WrkResult, wrk
from bench.procs import ROOT, Proc, export, fixed_upstream, passthrough, swapgate_with
from bench.sections import replace_section

DOCS = ROOT / "docs"
CONNECTIONS = 16
NAMES = {
    "passthrough": "bare passthrough (the floor)",
    "before": "swapgate before tracing (every default)",
    "off": "swapgate, tracing off (every default)",
    "on": "swapgate, every request traced to a collector",
}


def config(upstream: str, tracing: dict[str, object] | None = None) -> dict[str, object]:
    """Every default but the instance (and ``tracing``, when given)."""
    instances = [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}]
    return {"instances": instances, **({"tracing": tracing} if tracing else {})}


def measure(
    before: str, rounds: int, seconds: float
) -> tuple[dict[str, list[WrkResult]], dict[str, float]]:
    """wrk's results per round and the CPU seconds each contender spent under load."""
    results: dict[str, list[WrkResult]] = {name: [] for name in NAMES}
    cpu = dict.fromkeys(NAMES, 0.0)
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = stack.enter_context(fixed_upstream())
        traced = {"endpoint": upstream.url, "sample_ratio": 1.0}
        gateways: dict[str, Proc] = {
            "passthrough": stack.enter_context(passthrough(upstream.url)),
            "before": stack.enter_context(
                swapgate_with(config(upstream.url), source=export(before, scratch))
            ),
            "off": stack.enter_context(swapgate_with(config(upstream.url))),
            "on": stack.enter_context(swapgate_with(config(upstream.url, traced))),
        }
        for gateway in gateways.values():
            wrk(gateway.url, CONNECTIONS, 2)  # warm up
        for _ in range(rounds):
            for name, gateway in gateways.items():
                spent = gateway.cpu_seconds()
                results[name].append(wrk(gateway.url, CONNECTIONS, seconds))
                cpu[name] += gateway.cpu_seconds() - spent
    return results, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit before tracing")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8)
    args = parser.parse_args()
    results, cpu = measure(args.before, args.rounds, args.seconds)
    rps = {name: statistics.median(r.rps for r in runs) for name, runs in results.items()}
    p99 = {name: statistics.median(r.p99_ms for r in runs) for name, runs in results.items()}
    served = {name: sum(r.requests for r in runs) for name, runs in results.items()}
    per = {name: cpu[name] / served[name] * 1e6 for name in NAMES}  # µs a request
    errors = sum(r.errors for runs in results.values() for r in runs)
    for name in results:
        print(name, [round(r.rps) for r in results[name]], round(per[name], 1), flush=True)
    floor = rps["passthrough"]
    off, before, on = (rps[name] / floor for name in ("off", "before", "on"))
    rows = "\n".join(
        f"| {label} | {rps[name]:.0f} | {rps[name] / floor:.2f}× | {p99[name]:.1f} |"
        f" {per[name]:.0f} |"
        for name, label in NAMES.items()
    )
    replace_section(
        DOCS / "benchmarks.md",
        "tracing",
        f"""
## What tracing costs the warm path (`python -m bench.tracing`)

swapgate with every default in front of a fixed upstream (nginx), wrk with {CONNECTIONS}
connections, {args.rounds} rounds of {args.seconds:g} s on each contender in turn, one run on
this 2-core machine; medians of the rounds. "Before tracing" is commit `{args.before[:10]}`,
exported and run beside this tree. With tracing on, every request is sampled and its spans
(the request, its upstream call) exported to a collector that takes them at once.

| contender | requests/s | × passthrough | p99 (ms) | CPU a request (µs) |
|---|---|---|---|---|
{rows}

Tracing off: **{off:.2f}×** the passthrough against **{before:.2f}×** before tracing existed
({per["off"] - per["before"]:+.0f} µs of CPU a request; no OpenTelemetry SDK module is
imported). Every request traced: **{on:.2f}×**, **{per["on"] - per["off"]:.0f} µs** more CPU a
request for its spans, their context and their export; {errors} errors.
""",
    )


if __name__ == "__main__":
    main()
