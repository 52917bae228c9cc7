"""Open-loop replay of a trace against a gateway in front of simulated instances.

Each request is sent at its time in the trace (compressed by ``SPEEDUP``), whether or not the
ones before it were answered, as real clients do. Swaps are counted by the simulators.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import httpx

from bench import procs
from bench.trace import MODELS, Request
from swapgate.tools.processes import free_port, sim_command

SPEEDUP = 30.0  # trace seconds per replay second
LOAD_SECONDS = 20.0  # a swap, in trace time


@dataclass(frozen=True)
class ReplayResult:
    swaps: int
    p50_s: float
    p95_s: float
    max_s: float
    mean_wait_s: float
    max_wait_s: float
    errors: int
    # (status, count) of the failed requests; status 0: no HTTP answer at all
    error_statuses: tuple[tuple[int, int], ...] = ()

    def errors_text(self) -> str:
        return describe_errors(self.error_statuses)


def describe_errors(statuses: Sequence[tuple[int, int]]) -> str:
    """ "0", or the count with its statuses: "2 (503×1, no answer×1)"."""
    total = sum(n for _, n in statuses)
    if not total:
        return "0"
    kinds = ", ".join(f"{status or 'no answer'}×{n}" for status, n in statuses)
    return f"{total} ({kinds})"


@contextmanager
def simulators(
    count: int,
    models: Sequence[str] = MODELS,
    load_seconds: float = LOAD_SECONDS / SPEEDUP,
    token_rate: float = 30 * SPEEDUP,
) -> Iterator[list[procs.Proc]]:
    """``count`` simulated llama-swap instances of capacity 1 (times in replay seconds)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(_simulator(models, load_seconds, token_rate)) for _ in range(count)
        ]


@contextmanager
def _simulator(
    models: Sequence[str], load_seconds: float, token_rate: float
) -> Iterator[procs.Proc]:
    port = free_port()
    command = sim_command(
        "llama-swap",
        port,
        models=",".join(models),
        capacity=1,
        load_time=load_seconds,
        ttft=0,
        token_rate=token_rate,
    )
    with procs.running("sim", command, f"http://127.0.0.1:{port}") as proc:
        yield proc


def swapgate_config(
    sims: Sequence[procs.Proc], eviction: str, horizon: float | None = None
) -> dict[str, object]:
    """swapgate in front of ``sims``; ``horizon``: its ``demand_horizon``, if not the default."""
    return {
        "routing": {
            "eviction": eviction,
            **({"demand_horizon": horizon} if horizon is not None else {}),
            "poll_interval": "1s",
            "min_residency": f"{30 / SPEEDUP:.3f}s",
            "expected_swap": f"{LOAD_SECONDS / SPEEDUP:.3f}s",
            "max_wait": f"{120 / SPEEDUP:.3f}s",  # 120 s of trace time
        },
        "keepalive": {"early_headers_after": "300s"},
        "instances": [
            {"name": f"gpu-{i}", "kind": "llama-swap", "url": sim.url, "models": list(MODELS)}
            for i, sim in enumerate(sims)
        ],
    }


def replay(
    url: str, trace: Sequence[Request], sims: Sequence[procs.Proc], speedup: float = SPEEDUP
) -> ReplayResult:
    """Send ``trace`` to ``url``, ``speedup`` trace seconds per second; results in trace time."""
    loads_before = sum(_loads(sim) for sim in sims)
    outcomes = asyncio.run(_send_all(url, trace, speedup))
    latencies = sorted(seconds for seconds, _, _ in outcomes)
    quantiles = statistics.quantiles(latencies, n=100)
    return ReplayResult(
        swaps=sum(_loads(sim) for sim in sims) - loads_before,
        p50_s=quantiles[49] * speedup,
        p95_s=quantiles[94] * speedup,
        max_s=latencies[-1] * speedup,
        mean_wait_s=statistics.fmean(wait for _, _, wait in outcomes) * speedup,
        max_wait_s=max(wait for _, _, wait in outcomes) * speedup,
        errors=sum(1 for _, status, _ in outcomes if status != 200),
        error_statuses=tuple(sorted(Counter(s for _, s, _ in outcomes if s != 200).items())),
    )


async def _send_all(
    url: str, trace: Sequence[Request], speedup: float
) -> list[tuple[float, int, float]]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        started = time.monotonic()

        async def send(request: Request) -> tuple[float, int, float]:
            await asyncio.sleep(max(0.0, started + request.at / speedup - time.monotonic()))
            sent = time.monotonic()
            body = {"model": request.model, "messages": [], "max_tokens": request.tokens}
            try:
                response = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError:
                return time.monotonic() - sent, 0, 0.0
            waited = float(response.headers.get("x-swapgate-wait-ms", 0)) / 1000
            return time.monotonic() - sent, response.status_code, waited

        return list(await asyncio.gather(*(send(r) for r in trace)))


def _loads(sim: procs.Proc) -> int:
    return sum(httpx.get(f"{sim.url}/sim/stats", timeout=10).json()["loads"].values())
