"""``python -m bench.host_cache``: swaps from disk against swaps from RAM (docs/host-cache.md).

Two models of ~2 GB each (random-weight GGUFs, ``testbed.random_gguf``, f16) on one
``capacity: 1`` ``kind: process`` instance running llama.cpp's ``llama-server``, requested in
turn (each asked for once before, so that its demand is known). Before each swap the model it
loads has had its pages dropped, as a machine that has not read it lately would have them, and
the gateway idles a few seconds: the time between one user's turn and the next's. Once
without ``host_cache`` (the swap reads the disk), once with it (the prefetcher, knowing the
model is likely next, reads it into the page cache meanwhile).
Side by side in one run; each swap's duration from ``swapgate_swap_duration_seconds``. Writes
its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench import procs
from bench.sections import replace_section
from swapgate.control.memory import pages
from swapgate.tools.processes import free_port
from testbed import random_gguf
from testbed.cache import cache_root
from testbed.engines import ensure_llama_server

DOCS = Path(__file__).resolve().parents[1] / "docs"
# ~1.1 G parameters (TinyLlama's shape): ~2.2 GB in f16
SHAPE = random_gguf.Shape(layers=22, embedding=2048, feed_forward=5632, heads=32, kv_heads=4)
MODELS = ("a", "b")
IDLE = 6.0  # seconds between a swap and the next request: a turn's pause


def gguf(name: str) -> Path:
    """The model's random GGUF, written once per machine beside the engines."""
    path = cache_root() / "bench-weights" / f"{name}-1b-f16.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".part")
        random_gguf.write(partial, SHAPE, seed=MODELS.index(name))
        partial.rename(path)
    return path


def config(files: dict[str, Path], cached: bool) -> dict[str, Any]:
    server = ensure_llama_server().binary
    commands = {
        name: {
            "cmd": f"{server} -m {path} --host 127.0.0.1 --port ${{PORT}} -c 512 -t 2 -np 1 "
            "--no-webui",
            "ready": "/health",
        }
        for name, path in files.items()
    }
    settings: dict[str, Any] = {
        "routing": {"min_residency": 0, "poll_interval": "1s", "swap_timeout": "300s"},
        "instances": [
            {
                "name": "node",
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": commands,
            }
        ],
    }
    if cached:  # room for one model's weights beside the loaded one's
        settings["host_cache"] = {"budget": "3GiB", "read_rate": "1GiB/s"}
    return settings


def swaps(files: dict[str, Path], cached: bool, rounds: int) -> list[float]:
    """Each swap's duration in seconds, alternating the models."""
    durations = []
    with procs.swapgate_with(config(files, cached)) as gw, httpx.Client(timeout=600) as client:
        body = {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        for model in (*MODELS, MODELS[0]):  # each asked for once: its demand is known
            client.post(f"{gw.url}/v1/chat/completions", json={**body, "model": model})
        for turn in range(rounds):
            model = MODELS[(turn + 1) % 2]
            pages.let_go(files[model])  # not read lately: its pages are gone
            time.sleep(IDLE)
            before = _swap_seconds(client, gw.url, model)
            answer = client.post(f"{gw.url}/v1/chat/completions", json={**body, "model": model})
            answer.raise_for_status()
            durations.append(_swap_seconds(client, gw.url, model) - before)
    return durations


def _swap_seconds(client: httpx.Client, url: str, model: str) -> float:
    total = 0.0
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith("swapgate_swap_duration_seconds_sum") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    files = {name: gguf(name) for name in MODELS}
    size = files["a"].stat().st_size
    results = {}
    for mode, cached in (("cold (no host_cache)", False), ("host_cache", True)):
        results[mode] = swaps(files, cached, args.rounds)
        print(mode, [round(d, 2) for d in results[mode]], flush=True)
    cold, warm = results["cold (no host_cache)"], results["host_cache"]
    rows = [
        f"| {mode} | {len(d)} | {statistics.median(d):.2f} | {_p95(d):.2f} |"
        for mode, d in results.items()
    ]
    ratio = statistics.median(warm) / statistics.median(cold)
    replace_section(
        DOCS / "benchmarks.md",
        "host-cache",
        f"""
## Swaps from RAM: the cached tier (`python -m bench.host_cache`)

Two random-weight GGUFs of {size / 2**30:.1f} GiB each (f16, a 1.1 B Llama shape) on one
`capacity: 1` `process` instance running llama-server (CPU, `-t 2`), requested in turn; before
each swap the model it loads had its pages dropped, then {IDLE:g} s of idle. Swap durations
from `swapgate_swap_duration_seconds`, one run, side by side, on this 2-core machine:

| weights | swaps | p50 (s) | p95 (s) |
|---|---|---|---|
{chr(10).join(rows)}

With `host_cache` (budget 3 GiB) a swap takes **{ratio:.2f}×** a cold one's time (p50): the
prefetcher read the next model's weights into RAM during the idle seconds, so the load read
the page cache instead of the disk.
""",
    )


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


if __name__ == "__main__":
    main()
