"""``python -m bench.agents``: coding agents on one GPU and on two (docs/benchmarks.md).

Four agents, each looping four times over one planner turn and three coder turns, against the
real llama-swap (v250, running llama.cpp's llama-server with Gemma-3-270M on the CPU) whose
models take ``LOAD`` seconds to start, as a larger model's load would:

- one instance (one model at a time): llama-swap alone, and swapgate (defaults) in front of it;
- two instances: nginx round-robin over two llama-swaps, and swapgate over the same two;

each in lockstep (every turn right after the last) and with 0–2 s of tool work between turns
(seeded). For each: the swaps (every llama-server llama-swap started), the makespan, and the
p95 of a request's latency. Side by side in one run; writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import procs
from bench.sections import replace_section
from swapgate.tools.processes import free_port, serving
from testbed.engines import LlamaSwapEngine, ensure_llama_swap

DOCS = Path(__file__).resolve().parents[1] / "docs"
AGENTS, LOOPS = 4, 4
TURNS = ("planner", "coder", "coder", "coder")
LOAD = 3.0  # seconds each model takes to start
THINK = (0.0, 2.0)  # tool work between turns, seconds
# Tokens an answer: short, so that a turn takes about what it takes on a GPU (a few tenths of
# a second here, every agent in a slot of its own) and tool work, not the CPU, sets the pace
TOKENS = 2
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
POOL = """
  upstream pool {{
{members}
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
"""


@dataclass(frozen=True, slots=True)
class Result:
    swaps: int
    makespan: float
    p95: float


class Starts:
    """Counts the servers llama-swap starts: each new child process of theirs is one load."""

    def __init__(self, parents: list[int]) -> None:
        self._parents = parents
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Starts:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def count(self) -> int:
        return len(self._seen)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            for pid in self._parents:
                try:
                    self._seen.update(child.pid for child in psutil.Process(pid).children())
                except psutil.Error:
                    continue


def agent(url: str, number: int, think: bool, latencies: list[float]) -> None:
    rng = random.Random(number)
    for loop in range(LOOPS):
        for turn, model in enumerate(TURNS):
            if think:
                time.sleep(rng.uniform(*THINK))
            body = {
                "model": model,
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": f"Agent {number}, loop {loop}, step {turn}: go on."}
                ],
            }
            started = time.monotonic()
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
            answer.raise_for_status()
            latencies.append(time.monotonic() - started)


def session(url: str, parents: list[int], think: bool) -> Result:
    latencies: list[float] = []
    threads = [
        threading.Thread(target=agent, args=(url, n, think, latencies)) for n in range(AGENTS)
    ]
    with Starts(parents) as starts:
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        makespan = time.monotonic() - started
    if len(latencies) != AGENTS * LOOPS * len(TURNS):
        raise RuntimeError(f"{len(latencies)} answers of {AGENTS * LOOPS * len(TURNS)}")
    p95 = statistics.quantiles(latencies, n=20)[-1]
    return Result(starts.count, makespan, p95)


@contextmanager
def llama_swaps(engine: LlamaSwapEngine, root: Path, count: int) -> Iterator[list[Any]]:
    """``count`` llama-swaps serving planner and coder, one model at a time each."""
    with ExitStack() as stack:
        found = []
        for _ in range(count):
            port = free_port()
            models = {"planner": 2048, "coder": 2048}
            config = engine.write_config(
                root / f"ls-{port}.yaml", models, flags=("-np", str(AGENTS)), load_time=LOAD
            )
            url = f"http://127.0.0.1:{port}"
            command = engine.command(config, port)
            process = stack.enter_context(serving(command, f"{url}/health", log=subprocess.DEVNULL))
            found.append((url, process.pid))
        yield found


@contextmanager
def round_robin(urls: list[str]) -> Iterator[str]:
    port = free_port()
    members = "\n".join(f"    server {u.removeprefix('http://')};" for u in urls)
    with tempfile.TemporaryDirectory() as root:
        config = Path(root) / "nginx.conf"
        servers = POOL.format(members=members, port=port)
        config.write_text(procs.NGINX_MAIN.format(root=root, servers=servers))
        url = f"http://127.0.0.1:{port}"
        with serving(
            [NGINX, "-c", str(config), "-p", root], f"{url}/health", log=subprocess.DEVNULL
        ):
            yield url


def measure(engine: LlamaSwapEngine, count: int, front: str, think: bool) -> Result:
    """One session of the agents against ``count`` fresh llama-swaps behind ``front``:
    ``direct`` (one alone), ``nginx`` or ``swapgate``."""
    with tempfile.TemporaryDirectory() as root, llama_swaps(engine, Path(root), count) as swaps:
        urls, pids = [u for u, _ in swaps], [p for _, p in swaps]
        if front == "direct":
            return session(urls[0], pids, think)
        if front == "nginx":
            with round_robin(urls) as url:
                return session(url, pids, think)
        instances = [
            {"name": f"gpu-{n}", "kind": "llama-swap", "url": u, "capacity": 1}
            for n, u in enumerate(urls)
        ]
        with procs.swapgate_with({"instances": instances}) as gw:
            return session(gw.url, pids, think)


RUNS = (
    (1, "direct", "llama-swap alone"),
    (1, "swapgate", "swapgate in front"),
    (2, "nginx", "nginx round-robin over two llama-swaps"),
    (2, "swapgate", "swapgate over the same two"),
)


def main() -> None:
    engine = ensure_llama_swap()
    if engine is None:
        raise SystemExit("bench.agents needs llama-swap (shared/engines/llama-swap)")
    results: dict[tuple[int, str, bool], Result] = {}
    for think in (False, True):
        for count, front, _ in RUNS:
            results[count, front, think] = result = measure(engine, count, front, think)
            print(count, front, "tool work" if think else "lockstep", result, flush=True)
    rows = []
    for count, front, label in RUNS:
        cells = [results[count, front, think] for think in (False, True)]
        rows.append(
            f"| {count} | {label} | "
            + " | ".join(f"{r.swaps} | {r.makespan:.1f} s | {r.p95:.2f} s" for r in cells)
            + " |"
        )
    one, ratios = {f: results[1, f, True] for f in ("direct", "swapgate")}, []
    ratios.append(one["swapgate"].swaps / max(1, one["direct"].swaps))
    ratios.append(one["swapgate"].makespan / one["direct"].makespan)
    replace_section(
        DOCS / "benchmarks.md",
        "agents",
        f"""
## Coding agents on one GPU and on two (`python -m bench.agents`)

{AGENTS} agents, each looping {LOOPS} times over one planner turn and three coder turns
({TOKENS} tokens each, a slot per agent), against the real llama-swap v250 (llama-server,
Gemma-3-270M on the CPU) whose models take {LOAD:g} s to start; each instance holds one model
at a time. In lockstep, every turn follows the last at once; with tool work, 0–2 s (seeded)
pass between turns. Swaps are the servers llama-swap started. One run, side by side, on this
2-core machine.

| instances | front | lockstep: swaps | makespan | p95 | tool work: swaps | makespan | p95 |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

With tool work on one instance, swapgate's swaps are {ratios[0]:.2f}× llama-swap's alone and
its makespan {ratios[1]:.2f}×.
""",
    )


if __name__ == "__main__":
    main()
