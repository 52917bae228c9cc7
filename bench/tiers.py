"""``python -m bench.tiers``: the swap economics with warmth tiers (``make bench-swaps``).

The same seeded traces as ``bench.swaps``, replayed through swapgate (``eviction: lru``) in
front of two kinds of instance side by side: simulated llama-swap nodes, where every swap is a
20 s load, and ``kind: vllm-sleep`` GPUs, a simulated vLLM server per model asleep at level 1,
where a swap is a wake (2 s) after putting the awake one to sleep. Writes its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import httpx

from bench import procs, trace
from bench.replay import LOAD_SECONDS, SPEEDUP, ReplayResult, replay, simulators, swapgate_config
from bench.sections import replace_section
from swapgate.tools.processes import free_port, sim_command

DOCS = Path(__file__).resolve().parents[1] / "docs"
WAKE_SECONDS = 2.0  # a level-1 wake, in trace time


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tiers", description=__doc__)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--duration", type=float, default=1200.0, help="trace seconds")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [(seed, kind) for seed in seeds for kind in ("llama-swap", "vllm-sleep")]
    traces = {seed: trace.generate(seed, args.duration) for seed in seeds}
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda run: _replay(traces[run[0]], args.instances, run[1]), runs)
        results = dict(zip(runs, done, strict=True))
    markdown = render(results, args.instances, args.duration)
    replace_section(DOCS / "benchmarks.md", "tiers", markdown)
    print(markdown)
    return 0


def _replay(requests: list[trace.Request], count: int, kind: str) -> ReplayResult:
    if kind == "llama-swap":
        with simulators(count) as sims, procs.swapgate_with(swapgate_config(sims, "lru")) as gw:
            return replay(gw.url, requests, sims)
    with sleeping_gpus(count) as gpus:
        config = swapgate_config([], "lru")
        config["instances"] = [
            {
                "name": f"gpu-{i}",
                "kind": "vllm-sleep",
                "capacity": 1,
                "servers": {model: sim.url for model, sim in servers.items()},
            }
            for i, servers in enumerate(gpus)
        ]
        sims = [sim for servers in gpus for sim in servers.values()]
        with procs.swapgate_with(config) as gw:
            result = replay(gw.url, requests, sims)
            wakes = sum(_wakes(sim) for sim in sims)
        # replay() counts the simulators' loads, and sleeping servers never load: their wakes
        return replace(result, swaps=wakes)


@contextmanager
def sleeping_gpus(count: int) -> Iterator[list[dict[str, procs.Proc]]]:
    """``count`` GPUs, each a simulated vLLM server per model, every one asleep at level 1."""
    with ExitStack() as stack:
        yield [
            {model: stack.enter_context(_server(model)) for model in trace.MODELS}
            for _ in range(count)
        ]


@contextmanager
def _server(model: str) -> Iterator[procs.Proc]:
    port = free_port()
    command = sim_command(
        "vllm",
        port,
        models=model,
        asleep=1,
        wake_time=WAKE_SECONDS / SPEEDUP,
        ttft=0,
        token_rate=30 * SPEEDUP,
    )
    with procs.running("sim", command, f"http://127.0.0.1:{port}") as proc:
        yield proc


def _wakes(sim: procs.Proc) -> int:
    wakes: int = httpx.get(f"{sim.url}/sim/stats", timeout=10).json()["wakes"]
    return wakes


def render(results: dict[tuple[int, str], ReplayResult], count: int, duration: float) -> str:
    lines = [
        "## Swap economics with warmth tiers (`python -m bench.tiers`, part of `make bench-swaps`)",
        "",
        f"The traces above ({duration / 60:.0f} minutes, replayed {SPEEDUP:.0f}× faster), through"
        f" swapgate (`eviction: lru`) in front of {count} instances of capacity 1 of each kind,"
        f" side by side: llama-swap, where a swap is a {LOAD_SECONDS:.0f} s load, and"
        f" `kind: vllm-sleep`, a vLLM server per model asleep at level 1, where a swap is a"
        f" {WAKE_SECONDS:.0f} s wake. Latencies in trace seconds.",
        "",
        "How to read it: the eviction policy is the same, so the swaps are about as many; each"
        " costs a wake instead of a load, which is where the latency goes.",
        "",
        "| seed | instances are | swaps (loads or wakes) | p50 | p95 | max wait | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for (seed, kind), r in results.items():
        lines.append(
            f"| {seed} | {kind} | {r.swaps} | {r.p50_s:.1f} s | {r.p95_s:.1f} s"
            f" | {r.max_wait_s:.1f} s | {r.errors_text()} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
