"""What each step of the warm path costs: swapgate served in this process, exactly as ``swapgate
serve`` serves it (its uvicorn config, its collector setting), under cProfile while wrk loads it
from outside; then each pipeline step's CPU per request, read from the profile.

The profiler slows every Python call, so the microseconds are the profiled ones, larger than
unprofiled; the shares of the request's time are what to read. ``python -m bench.steps`` writes
its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from dataclasses import dataclass

import uvicorn

from bench.load import wrk
from bench.procs import fixed_upstream
from bench.sections import replace_section
from bench.warm import CONNECTIONS, DOCS, config_for
from swapgate.config.loading import parse_config
from swapgate.server.app import create_app
from swapgate.server.serve import server_config, tune_collector
from swapgate.tools.processes import free_port


@dataclass(frozen=True)
class Step:
    name: str
    file: str  # the path's end
    function: str
    what: str


# In the order a request meets them; a step's time includes the steps it calls (indented)
STEPS = (
    Step("server", "swapgate/server/app.py", "__call__", "everything after uvicorn's parsing"),
    Step("pipeline", "swapgate/proxy/handler.py", "__call__", "ProxyEndpoint, all steps"),
    Step("admit", "swapgate/proxy/pipeline/admit.py", "admit", "Admission.admit"),
    Step("  keep_alive", "swapgate/policy/idle_timeout.py", "read", "the request's keep_alive"),
    Step("  fallbacks", "swapgate/proxy/pipeline/fallback_models.py", "early", "model fallbacks"),
    Step("  params", "swapgate/proxy/request.py", "shape", "models.M.params"),
    Step("place", "swapgate/control/routing/failover.py", "first", "Attempts.first (router)"),
    Step("send", "swapgate/proxy/pipeline/send.py", "open", "Sender.open, with placing"),
    Step("  upstream", "swapgate/proxy/upstream.py", "open", "aiohttp's request out"),
    Step("answer", "swapgate/proxy/pipeline/answer.py", "answer", "the answer passed on"),
    Step("record", "swapgate/proxy/records.py", "done", "metrics, access line, activity"),
    Step("  reports", "swapgate/proxy/records.py", "first_byte", "the decay watch's TTFT"),
    Step("  released", "swapgate/proxy/records.py", "released", "the idle unloader told"),
)


@dataclass(frozen=True)
class Profiled:
    requests: int
    cpu: float  # the process's CPU seconds while loaded
    seconds: dict[str, float]  # each step's cumulative seconds


def profile(seconds: float) -> Profiled:
    with fixed_upstream() as upstream:
        try:  # uvicorn's loop="auto" serves on uvloop where it is installed
            import uvloop

            return uvloop.run(_profile(upstream.url, seconds))
        except ImportError:
            return asyncio.run(_profile(upstream.url, seconds))


async def _profile(upstream: str, seconds: float) -> Profiled:
    port = free_port()
    settings = parse_config({**config_for(upstream), "server": {"port": port, "access_log": False}})
    server = uvicorn.Server(server_config(settings, create_app(settings), "127.0.0.1", port))
    tune_collector()
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    await asyncio.to_thread(wrk, url, CONNECTIONS, 2)  # warm up
    profiler = cProfile.Profile()
    cpu = time.process_time()
    profiler.enable()  # this thread only: the event loop's, not wrk's waiting thread
    load = await asyncio.to_thread(wrk, url, CONNECTIONS, seconds)
    profiler.disable()
    cpu = time.process_time() - cpu
    server.should_exit = True
    await task
    stats = pstats.Stats(profiler)
    return Profiled(load.requests, cpu, _cumulative(stats))


def _cumulative(stats: pstats.Stats) -> dict[str, float]:
    found = dict.fromkeys((step.name for step in STEPS), 0.0)
    table = stats.stats  # type: ignore[attr-defined]
    for (file, _, function), (_, _, _, cumulative, _) in table.items():
        for step in STEPS:
            if file.endswith(step.file) and function == step.function:
                found[step.name] += cumulative
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    run = profile(args.seconds)
    whole = run.seconds["server"]
    rows = []
    for step in STEPS:
        spent = run.seconds[step.name]
        micro = spent / run.requests * 1e6
        rows.append(f"| {step.name} | {step.what} | {micro:.1f} | {spent / whole:.0%} |")
    per_request = run.cpu / run.requests * 1e6
    table = "\n".join(rows)
    print(table)
    replace_section(
        DOCS / "benchmarks.md",
        "steps",
        f"""
## What each step of the warm path costs (`python -m bench.steps`)

swapgate served in the benchmark's own process, as `swapgate serve` serves it, under cProfile,
while wrk ({CONNECTIONS} connections, {args.seconds:g} s) posts a small chat request for a
model with no params, ttl, fallbacks or context (the fixed upstream of the warm path above).
{run.requests:,} requests; the whole process spent {per_request:.0f} µs of CPU on each (uvicorn,
the event loop and the profiler's own cost included). A step's time includes the indented steps
under it; microseconds are profiled ones (the profiler inflates Python calls), the shares of
what swapgate's ASGI app spent (`server`) are what to read.

| step | what | µs per request, profiled | share of `server` |
|---|---|---|---|
{table}
""",
    )


if __name__ == "__main__":
    main()
