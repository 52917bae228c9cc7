"""Realistic fleets hit by a burst of cold requests (issue 63), as a new user would try them:
fake llama-swap instances that each serve every model, swapgate's defaults, and a burst of
streamed and non-streamed chat completions for many cold models at once.

What the user notices: every request answers 200 with a whole body (a stream ends with
``data: [DONE]`` after its content, a JSON answer parses, after any keep-alive whitespace, with
its choices), no error in-band, and the fleet loads each model it was asked for about once, not
over and over. Before 21cc660 a fleet with capacity 2 filled up, placement's starvation rule
weighed an instance with a free place, and every request that reached it failed: a 500, or, once
its early headers were out, a 200 whose body ended mid-answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.e2e.processes import Gateway, Sim, gateway, instance, metric_in, simulator

pytestmark = pytest.mark.e2e
GIB = 2**30


@dataclass(frozen=True)
class Fleet:
    instances: int
    models: int
    capacity: int
    requests: int
    distinct: int  # the burst asks for this many models, the first ones, round robin
    memory_gib: int | None = None  # each instance's, with sizes below: memory limits too
    sizes_gib: tuple[int, ...] = ()  # model i takes sizes_gib[i % len(sizes_gib)]

    def names(self) -> list[str]:
        return [f"m{i:02d}" for i in range(self.models)]

    def size_of(self, model: str) -> int:
        return self.sizes_gib[int(model[1:]) % len(self.sizes_gib)] * GIB if self.sizes_gib else 0


FLEETS = {
    # The rows that failed: 6 of 32 and 9 of 48 answered before the fix. (Its first row,
    # 2 x 8 at capacity 1 with 48 requests for 7 models, answered in full before it too.)
    "4x32-cap2-32for31": Fleet(instances=4, models=32, capacity=2, requests=32, distinct=31),
    "8x64-cap2-48for48": Fleet(instances=8, models=64, capacity=2, requests=48, distinct=48),
    # Capacity 3 under 24 GiB: three 6s fit, a 14 with a 10 fits, two 14s do not, so memory,
    # not the count, is what limits most of the time.
    "4x16-cap3-24GiB-32for16": Fleet(
        instances=4,
        models=16,
        capacity=3,
        requests=32,
        distinct=16,
        memory_gib=24,
        sizes_gib=(6, 10, 14),
    ),
}


@dataclass
class Outcome:
    model: str
    stream: bool
    status: int = 0
    problem: str = ""  # empty: a whole answer
    seconds: float = 0.0


def load_times(fleet: Fleet) -> str:
    """0.2 to 0.6 s, spread over the models: short, so several rounds of swaps fit in seconds,
    and unequal, so swaps on one instance end out of the order they began."""
    return ",".join(f"{m}={0.2 + 0.1 * (i % 5):.1f}" for i, m in enumerate(fleet.names()))


@contextmanager
def running(fleet: Fleet) -> Iterator[tuple[list[Sim], Gateway]]:
    """The fleet's simulators, one process each (a simulator listens on one port), and a
    gateway with its defaults in front of them."""
    with ExitStack() as stack:
        sims = [
            stack.enter_context(
                simulator(
                    models=tuple(fleet.names()),
                    load_time=0.4,
                    load_times=load_times(fleet),
                    capacity=fleet.capacity,
                )
            )
            for _ in range(fleet.instances)
        ]
        limits: dict[str, Any] = {"capacity": fleet.capacity}
        if fleet.memory_gib is not None:
            limits["memory"] = f"{fleet.memory_gib}GiB"
        config: dict[str, Any] = {
            "instances": [instance(f"gpu-{i}", sim, **limits) for i, sim in enumerate(sims)],
            "server": {"access_log": False},
        }
        if fleet.sizes_gib:
            config["models"] = {m: {"memory": fleet.size_of(m)} for m in fleet.names()}
        yield sims, stack.enter_context(gateway(config))


async def ask(session: aiohttp.ClientSession, url: str, model: str, stream: bool) -> Outcome:
    """One chat completion, read to its end; what a client would make of it."""
    outcome = Outcome(model, stream)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": stream,
    }
    started = time.monotonic()
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            outcome.status = response.status
            raw = await response.read()
    except aiohttp.ClientError as exc:  # a body cut short after its headers lands here
        outcome.problem = f"cut short: {type(exc).__name__}"
        return outcome
    finally:
        outcome.seconds = time.monotonic() - started
    if outcome.status != 200:
        outcome.problem = f"status {outcome.status}"
    else:
        outcome.problem = streamed_problem(raw) if stream else json_problem(raw)
    return outcome


def streamed_problem(raw: bytes) -> str:
    """What is wrong with a streamed answer, or "". Keep-alives are SSE comments (": ...")."""
    data = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    if not data or data[-1] != "[DONE]":
        return "stream without data: [DONE]"
    chunks = [json.loads(event) for event in data[:-1]]
    if any("error" in chunk for chunk in chunks):
        return "error event in the stream"
    if not any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks):
        return "stream without content"
    return ""


def json_problem(raw: bytes) -> str:
    """What is wrong with a JSON answer, or "". Whitespace may come first: keep-alives sent
    while its model loaded (docs/configuration.md, keepalive.non_streaming)."""
    try:
        answer = json.loads(raw)  # json.loads skips the leading whitespace
    except ValueError:
        return "body is not JSON"
    if "error" in answer:
        return "error object after the keep-alives"
    if not answer.get("choices") or not answer["choices"][0]["message"].get("content"):
        return "answer without choices"
    return ""


async def most_held(sims: list[Sim], fleet: Fleet, session: aiohttp.ClientSession) -> int:
    """Polls every simulator's resident set (models loading included) until cancelled; the
    most memory any instance held at once, by the sizes the gateway was told."""
    most = 0
    try:
        while True:
            for sim in sims:
                async with session.get(f"{sim.url}/sim/stats") as response:
                    resident = (await response.json())["resident"]
                most = max(most, sum(fleet.size_of(m) for m in resident))
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        return most


async def burst(sims: list[Sim], gw: Gateway, fleet: Fleet) -> tuple[list[Outcome], int]:
    """Every request of the burst at once, each on its own connection, half of them streamed;
    and the most memory an instance held meanwhile."""
    wanted = [fleet.names()[i % fleet.distinct] for i in range(fleet.requests)]
    # Longer than routing.max_wait (120 s by default): the gateway, not the client, gives up.
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=timeout
    ) as session:
        watcher = asyncio.create_task(most_held(sims, fleet, session))
        try:
            outcomes = await asyncio.gather(
                *(ask(session, gw.url, model, i % 2 == 0) for i, model in enumerate(wanted))
            )
        finally:
            watcher.cancel()
        return outcomes, await watcher


@pytest.mark.parametrize("fleet", FLEETS.values(), ids=FLEETS.keys())
def test_a_burst_of_cold_models_on_a_fleet_answers_every_request_whole(fleet: Fleet) -> None:
    with running(fleet) as (sims, gw):
        outcomes, held = asyncio.run(burst(sims, gw, fleet))
        loads = sum(sim.loads() for sim in sims)
        metrics = gw.metrics()
    swaps = metric_in(metrics, "swapgate_swaps_total")
    failed = [o for o in outcomes if o.problem]
    summary: dict[str, int] = {}
    for outcome in failed:
        key = f"{'streamed' if outcome.stream else 'json'}: {outcome.problem}"
        summary[key] = summary.get(key, 0) + 1
    assert not failed, f"{len(failed)} of {len(outcomes)} requests failed: {summary}"
    assert metric_in(metrics, "swapgate_internal_errors_total") == 0, "no fault of its own"
    # Each model asked for loads once; a model evicted under the burst and asked for again may
    # load twice, but no more than once per instance beyond that: no thrash.
    bound = fleet.distinct + fleet.instances
    assert fleet.distinct <= loads <= bound, (loads, bound)
    assert swaps == loads, "the gateway counts the swaps its instances made"
    if fleet.memory_gib is not None:  # a simulator has no memory to run out of: its models' sizes
        assert held <= fleet.memory_gib * GIB, f"{held / GIB:g} GiB on one instance at once"
