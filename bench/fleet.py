"""``python -m bench.fleet [--against DIR] [--quick]``: what a gateway costs as its fleet grows.

The gateway in front of 4, 32, 128 and 256 simulated llama-swap instances serving 32 to 64
models each, all simulators in one process (``swapgate sim --ports``). Per fleet: the gateway's
idle CPU (nothing asked, its polls alone), the p50 of warm requests one at a time, and the
time and size of ``/metrics`` and the time of ``/v1/models``. With ``--against DIR`` (an
earlier commit exported there: ``git archive COMMIT | tar -x -C DIR``), that gateway runs beside
this tree's in front of the same simulators: idle side by side, requests alternating, so that
the machine's noise falls on both. Writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_report import Figures, section
from bench.procs import Proc, running, swapgate_with
from bench.sections import replace_section
from swapgate.tools.processes import free_port, sim_command

DOCS = Path(__file__).resolve().parents[1] / "docs"
FLEETS = ((4, 32), (32, 32), (128, 32), (256, 64))  # instances × models each
CAPACITY = 2  # models resident at once on each instance
WANTED = "m00"  # the model of the warm requests
COPIES = 2  # the instances it is warm on, at every fleet size
# A gateway in front of the first few of the same simulators, beside the one measured: a warm
# request's latency at N instances is read against it, all else equal (the simulators, the load
# of N instances' polls on the machine's two cores)
BESIDE, BESIDE_NAME = 4, "beside"
# The simulators keep idle connections as llama-swap does (it closes none): a poll every 5 s
# finds its connection open (against llama-server, which closes it after 5 s, each reconnects)
KEEP_ALIVE = 300
ASK = {"model": WANTED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@dataclass(frozen=True)
class Settings:
    idle: float  # seconds of idle CPU measured
    requests: int  # warm requests to each gateway
    scrapes: int  # /metrics and /v1/models reads of each


def models(count: int) -> list[str]:
    return [f"m{n:02d}" for n in range(count)]


def warm_plan(instances: int, names: Sequence[str], capacity: int) -> list[list[str]]:
    """What each instance has warm: ``capacity`` models each. The first model on the first
    ``COPIES`` instances whatever the fleet's size (what a request for it costs depends on its
    copies, not on the fleet: docs/architecture.md); the rest round the other models, so that
    each of them is warm somewhere and on about as many instances."""
    others = names[1:]
    plan: list[list[str]] = []
    taken = 0
    for k in range(instances):
        first = [names[0]] if k < COPIES else []
        wanted = capacity - len(first)
        plan.append(first + [others[(taken + j) % len(others)] for j in range(wanted)])
        taken += wanted
    return plan


def copies(plan: Sequence[Sequence[str]], model: str) -> int:
    return sum(model in warm for warm in plan)


def fleet_config(urls: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
    instances = [
        {
            "name": f"i{k:03d}",
            "kind": "llama-swap",
            "url": url,
            "models": list(names),
            "capacity": CAPACITY,
        }
        for k, url in enumerate(urls)
    ]
    return {"instances": instances}


def free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


@contextmanager
def simulators(instances: int, names: Sequence[str]) -> Iterator[list[str]]:
    """``instances`` llama-swap simulators in one process, each loading at once; their URLs."""
    ports = free_ports(instances)
    command = sim_command(
        "llama-swap",
        ports[0],
        ports=",".join(map(str, ports)),
        models=",".join(names),
        capacity=CAPACITY,
        load_time=0,
        ttft=0,
        token_rate=1_000_000,
        keep_alive=KEEP_ALIVE,
    )
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    # Bound in order: once the last answers, all do. Quiet: each load says a line.
    with running("simulators", command, urls[-1], log=subprocess.DEVNULL):
        yield urls


def warm(urls: Sequence[str], plan: Sequence[Sequence[str]]) -> None:
    """Load each instance's models on the simulators themselves (the gateways see them at
    their next poll): no swap goes through a gateway."""
    with httpx.Client(timeout=30) as client:
        for url, names in zip(urls, plan, strict=True):
            for name in names:
                client.get(f"{url}/upstream/{name}/health").raise_for_status()


def wait_warm(gateway: Proc, model: str, wanted: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()["data"]
        entry = next(e for e in listing if e["id"] == model)
        if len(entry["swapgate"]["warm_on"]) == wanted:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{gateway.name}: {model} not warm on {wanted} instances in {timeout}s")


def idle_cores(gateways: dict[str, Proc], seconds: float) -> dict[str, float]:
    """Each gateway's CPU over the same ``seconds`` with nothing asked, in cores."""
    before = {name: proc.cpu_seconds() for name, proc in gateways.items()}
    time.sleep(seconds)
    return {name: (proc.cpu_seconds() - before[name]) / seconds for name, proc in gateways.items()}


def timed(
    clients: dict[str, httpx.Client], ask: Callable[[httpx.Client], httpx.Response], times: int
) -> dict[str, list[float]]:
    """Each client's ``ask``, ``times`` times in turn (alternating), in ms; the last sizes too."""
    spent: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(times):
        for name, client in clients.items():
            started = time.perf_counter()
            ask(client).raise_for_status()
            spent[name].append((time.perf_counter() - started) * 1000)
    return spent


def measure_fleet(
    instances: int, count: int, sources: dict[str, Path | None], settings: Settings
) -> dict[str, Figures]:
    """Each source's figures in front of ``instances`` simulators of ``count`` models."""
    names = models(count)
    plan = warm_plan(instances, names, CAPACITY)
    with ExitStack() as stack:
        urls = stack.enter_context(simulators(instances, names))
        config = fleet_config(urls, names)
        gateways = {
            name: stack.enter_context(swapgate_with(config, source=source))
            for name, source in sources.items()
        }
        # This tree in front of the first few of the same simulators: the warm requests' yardstick
        beside = stack.enter_context(swapgate_with(fleet_config(urls[:BESIDE], names)))
        warm(urls, plan)
        for gateway in gateways.values():
            wait_warm(gateway, WANTED, copies(plan, WANTED))
        wait_warm(beside, WANTED, copies(plan[:BESIDE], WANTED))
        time.sleep(6)  # what the last poll and listing set off is done
        idle = idle_cores(gateways, settings.idle)
        clients = {
            name: stack.enter_context(httpx.Client(base_url=g.url, timeout=60))
            for name, g in [*gateways.items(), (BESIDE_NAME, beside)]
        }
        return _figures(clients, idle, settings)


def _figures(
    clients: dict[str, httpx.Client], idle: dict[str, float], settings: Settings
) -> dict[str, Figures]:
    def chat(client: httpx.Client) -> httpx.Response:
        return client.post("/v1/chat/completions", json=ASK)

    timed(clients, chat, 50)  # warm-up: connections, caches
    warm_ms = {
        name: statistics.median(ms) for name, ms in timed(clients, chat, settings.requests).items()
    }
    measured = {name: client for name, client in clients.items() if name in idle}
    metrics_ms = timed(measured, lambda c: c.get("/metrics"), settings.scrapes)
    listing_ms = timed(measured, lambda c: c.get("/v1/models"), settings.scrapes)
    sizes = {name: len(client.get("/metrics").content) for name, client in measured.items()}
    return {
        name: Figures(
            idle[name],
            warm_ms[name],
            statistics.median(metrics_ms[name]),
            sizes[name],
            statistics.median(listing_ms[name]),
            warm_ms[BESIDE_NAME],
        )
        for name in measured
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--against", type=Path, help="an exported earlier tree to compare with")
    parser.add_argument("--label", default="before", help="what to call the --against tree")
    parser.add_argument("--quick", action="store_true", help="shorter runs, for a smoke test")
    parser.add_argument("--no-write", action="store_true", help="print, leave the docs alone")
    args = parser.parse_args()
    settings = Settings(5.0, 100, 5) if args.quick else Settings(15.0, 300, 15)
    sources: dict[str, Path | None] = {"this tree": None}
    if args.against is not None:
        sources = {args.label: args.against.resolve(), **sources}
    results: dict[tuple[int, int], dict[str, Figures]] = {}
    for instances, count in FLEETS:
        results[(instances, count)] = measure_fleet(instances, count, sources, settings)
        print(instances, count, results[(instances, count)], flush=True)
    markdown = section(results, settings.idle, settings.requests, args.label)
    if not args.no_write:
        replace_section(DOCS / "benchmarks.md", "fleet", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
