"""A fleet when parts break, end to end (docs/operations.md, "When part of the fleet breaks"):
8 simulated llama-swap instances of capacity 2 serving the same 24 models behind two replicas on
a real Redis, waves of mixed requests (streamed or not; chat, Messages, Responses), with a model
whose engine exits at every start, loads failing at random on one instance, an instance killed
mid-burst and started again, and one that stops answering (SIGSTOP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import pytest

from bench.redis import redis_server
from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
MODELS = tuple(f"m{n:02d}" for n in range(24))
BROKEN = "m23"  # its engine exits at every start, on every instance
HEALTHY = MODELS[:-1]
LOAD = 0.3
TOKEN = "chaos-admin"


@dataclass
class Answer:
    model: str
    status: int
    seconds: float
    problem: str  # what a client would find wrong with a 200, or ""
    error: dict[str, Any]  # the error object of a refusal


@dataclass
class Chaos:
    sims: list[Sim]
    ports: list[int]
    replicas: list[Gateway]

    def loads(self, model: str) -> int:
        """The loads of ``model`` the simulators started (each a start of its engine)."""
        return sum(s.stats()["loads"].get(model, 0) for s in self.sims)

    def failed_swaps(self, model: str) -> float:
        """The failed loads of ``model`` the replicas counted (the simulators' counts die with
        a killed one)."""
        return sum(
            r.metric("swapgate_swaps_total", model=model, result="failed") for r in self.replicas
        )

    def resident(self, index: int) -> list[str]:
        return list(self.sims[index].stats()["resident"])


@contextmanager
def chaos() -> Iterator[Chaos]:
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server())
        sims, ports = [], []
        for n in range(8):
            flags: dict[str, Any] = {"fail_load_rate": 0.2, "seed": 7} if n == 7 else {}
            sim = stack.enter_context(
                simulator(
                    models=MODELS, load_time=LOAD, capacity=2, broken=BROKEN, max_tokens=4, **flags
                )
            )
            sims.append(sim)
            ports.append(int(sim.url.rsplit(":", 1)[1]))
        config = {
            "routing": {"poll_interval": "1s", "min_residency": 0},
            "keepalive": {"early_headers_after": "500ms", "interval": "1s"},
            "server": {"access_log": False},
            "instances": [instance(f"i{n}", sim, capacity=2) for n, sim in enumerate(sims)],
        }
        env = {"SWAPGATE_REDIS_URL": redis.url, "SWAPGATE_ADMIN_TOKEN": TOKEN}
        replicas = [
            stack.enter_context(gateway(config, {**env, "SWAPGATE_CLUSTER__REPLICA_ID": name}))
            for name in ("r1", "r2")
        ]
        yield Chaos(sims, ports, replicas)


def request_for(model: str, n: int) -> tuple[str, dict[str, Any]]:
    """The n-th request of a wave: chat, Messages or Responses, streamed every other time."""
    stream = n % 2 == 0
    hello = [{"role": "user", "content": "hi"}]
    if n % 3 == 1:
        return "/v1/messages", {
            "model": model,
            "max_tokens": 4,
            "messages": hello,
            "stream": stream,
        }
    if n % 3 == 2:
        return "/v1/responses", {"model": model, "input": "hi", "stream": stream}
    return "/v1/chat/completions", {"model": model, "messages": hello, "stream": stream}


def problem(path: str, raw: bytes, stream: bool) -> str:
    """What is wrong with a 200, or "": an error inside it, or an answer cut short. Whitespace
    or SSE comments (keep-alives) may come first."""
    if not stream:
        answer = json.loads(raw)
        return "an error inside the 200" if answer.get("error") else ""
    text = raw.decode(errors="replace")
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    parsed = [json.loads(e) for e in events if e != "[DONE]"]
    if any(e.get("error") or e.get("type") == "error" for e in parsed):
        return "an error event inside the 200"
    ends = {
        "/v1/chat/completions": "data: [DONE]",
        "/v1/messages": "message_stop",
        "/v1/responses": "response.completed",
    }
    return "" if ends[path] in text else "stream cut short"


async def ask(session: aiohttp.ClientSession, url: str, model: str, n: int) -> Answer:
    """One request, read to its end. A failure told after early headers comes inside the 200:
    an error event, or after whitespace the error object on a connection then cut (so that
    SDKs raise): its error is read from what came."""
    path, body = request_for(model, n)
    started = time.monotonic()
    raw, cut = b"", ""
    async with session.post(url + path, json=body) as response:
        try:
            async for chunk in response.content.iter_any():
                raw += chunk
        except aiohttp.ClientPayloadError as exc:
            cut = f"{path} cut short: {exc!r}"
    seconds = time.monotonic() - started
    error = told_error(raw)
    if response.status != 200 or error:
        return Answer(model, response.status, seconds, "", error)
    return Answer(model, 200, seconds, cut or problem(path, raw, body["stream"]), {})


def told_error(raw: bytes) -> dict[str, Any]:
    """The error object an answer carries (its body, or an event of its stream), or {}."""
    text = raw.decode(errors="replace").strip()
    for line in reversed(text.splitlines() or [""]):
        found = line.removeprefix("data: ").strip()
        if '"error"' not in found:
            continue
        with contextlib.suppress(ValueError):
            error = json.loads(found).get("error")
            if isinstance(error, dict):
                return error
    return {}


async def wave(c: Chaos, models: list[str]) -> list[Answer]:
    """Every request at once, each on its own connection, alternating between the replicas."""
    timeout = aiohttp.ClientTimeout(total=180)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return await asyncio.gather(
            *(ask(session, c.replicas[n % 2].url, model, n) for n, model in enumerate(models))
        )


def only_here(c: Chaos, besides: int) -> tuple[int, str]:
    """An instance (not ``besides``) and a model warm there alone."""
    held = {n: set(c.resident(n)) for n in range(7) if n != besides}
    for n, models in held.items():
        alone = models - set().union(*(m for k, m in held.items() if k != n))
        if alone:
            return n, sorted(alone)[0]
    raise AssertionError(f"no model is warm on one instance alone: {held}")


def healthy_ok(answers: list[Answer]) -> None:
    bad = [a for a in answers if a.model != BROKEN and (a.status != 200 or a.problem)]
    assert not bad, bad


def test_a_broken_model_a_dead_host_and_a_hung_host_cost_one_answer_each() -> None:
    with chaos() as c:
        # A wave over every model: the broken one answered within its two load attempts
        first = asyncio.run(wave(c, [*HEALTHY, BROKEN, BROKEN, BROKEN]))
        healthy_ok(first)
        broken = [a for a in first if a.model == BROKEN]
        assert all(a.error for a in broken), broken  # 503, or told after early headers
        assert {a.error.get("code", a.error.get("type")) for a in broken} <= {
            "model_failing",
            "swap_failed",
            "overloaded_error",  # Anthropic's shape of a 503
        }
        assert any("exited prematurely" in a.error["message"] for a in broken), broken
        assert max(a.seconds for a in broken) < 2 * LOAD + 5
        tried = c.loads(BROKEN)
        assert 2 <= tried <= 4, "two attempts, one replica's and maybe the other's first"

        # Known failing on both replicas: answered at once, no load more
        for replica in c.replicas:
            wait_for(lambda r=replica: r.metric("swapgate_model_failing", model=BROKEN) == 1.0)
        again = asyncio.run(wave(c, [BROKEN] * 8 + list(HEALTHY[:8])))
        healthy_ok(again)
        refused = [a for a in again if a.model == BROKEN]
        assert all("is failing" in a.error.get("message", "") for a in refused), refused
        assert max(a.seconds for a in again if a.model == BROKEN) < 1.0
        assert c.loads(BROKEN) == tried
        swaps = c.failed_swaps(BROKEN)
        listed = httpx.get(f"{c.replicas[1].url}/v1/models", timeout=10).json()["data"]
        status = next(m["status"] for m in listed if m["id"] == BROKEN)
        assert status["value"] == "failing"
        assert "exited prematurely" in status["reason"]

        # A dead host: its warm models' requests are placed again, never a 502
        dead = next(n for n in range(7) if c.resident(n))
        held = c.resident(dead)
        c.sims[dead].kill()
        after_kill = asyncio.run(wave(c, held * 4 + list(HEALTHY[8:16])))
        healthy_ok(after_kill)
        for replica in c.replicas:
            assert replica.metric("swapgate_instance_up", instance=f"i{dead}") == 0.0
        # ...and started again: it serves once its poll finds it back
        with simulator(
            models=MODELS, load_time=LOAD, capacity=2, broken=BROKEN, port=c.ports[dead]
        ) as back:
            c.sims[dead] = back
            for replica in c.replicas:
                wait_for(
                    lambda r=replica: r.metric("swapgate_instance_up", instance=f"i{dead}") == 1.0,
                    timeout=20,
                )

            # A hung host: what waits on it ends once it is declared down, not at 120 s
            hung, model = only_here(c, besides=dead)
            os.kill(c.sims[hung].process.pid, signal.SIGSTOP)
            try:
                stuck = asyncio.run(wave(c, [model] * 2 + list(HEALTHY[16:])))
            finally:
                os.kill(c.sims[hung].process.pid, signal.SIGCONT)
            healthy_ok([a for a in stuck if a.model != model])
            held_there = [a for a in stuck if a.model == model]
            assert all(a.seconds < 30 for a in held_there), held_there  # not 120 s
            for answer in held_there:  # it may have run them: not sent elsewhere
                assert answer.error.get("code", "instance_down") == "instance_down", answer
                assert f"i{hung} was declared down" in answer.error["message"]
            # One probe at a time, fleet-wide, once it is due
            time.sleep(10.5)
            probed = asyncio.run(wave(c, [BROKEN] * 6))
            assert all("is failing" in a.error.get("message", "") for a in probed), probed
            assert c.failed_swaps(BROKEN) == swaps + 1
