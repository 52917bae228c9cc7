"""Seeded traces of a realistic day, and offline scorers that count the swaps each strategy needs.

A day has three workloads, each on its own model(s): short interactive bursts (a team chatting
with one of two chat models), steady medium traffic (a coding assistant), and blocks of long batch
prompts (a nightly-style job, a few times a day). Scorers see the whole trace at once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    at: float  # seconds into the trace
    model: str
    tokens: int


def generate(seed: int, duration: float = 3600.0) -> list[Request]:
    dice = random.Random(seed)
    requests: list[Request] = []
    t = 0.0
    while t < duration:  # interactive bursts: 4-12 requests within ~20 s, on one chat model
        t += dice.expovariate(1 / 90)
        model = dice.choice(("chat-a", "chat-b"))
        start = t
        for _ in range(dice.randint(4, 12)):
            requests.append(Request(start + dice.uniform(0, 20), model, dice.randint(20, 60)))
    t = 0.0
    while t < duration:  # steady medium traffic
        t += dice.expovariate(1 / 12)
        requests.append(Request(t, "coder", dice.randint(40, 120)))
    t = dice.uniform(0, duration / 4)
    while t < duration:  # blocks of long batch prompts
        for i in range(dice.randint(10, 25)):
            requests.append(
                Request(t + i * dice.uniform(1.0, 3.0), "batch", dice.randint(150, 300))
            )
        t += dice.uniform(duration / 5, duration / 3)
    return sorted((r for r in requests if r.at < duration), key=lambda r: r.at)


def one_instance(trace: Sequence[Request]) -> int:
    """Every change of model is a swap."""
    swaps, current = 0, None
    for request in trace:
        if request.model != current:
            swaps, current = swaps + 1, request.model
    return swaps


def round_robin(trace: Sequence[Request], instances: int) -> int:
    """A plain load balancer: request i goes to instance i mod N, whatever it has warm."""
    swaps, warm = 0, list[str | None]([None] * instances)
    for index, request in enumerate(trace):
        slot = index % instances
        if warm[slot] != request.model:
            swaps, warm[slot] = swaps + 1, request.model
    return swaps


def lru(trace: Sequence[Request], instances: int) -> int:
    """Warm-aware routing, least recently used model evicted (capacity 1 each)."""
    swaps, last_use = 0, dict[str, int]()  # model -> last use, for the models warm now
    for index, request in enumerate(trace):
        if request.model not in last_use:
            swaps += 1
            if len(last_use) == instances:
                del last_use[min(last_use, key=last_use.__getitem__)]
        last_use[request.model] = index
    return swaps


def belady(trace: Sequence[Request], instances: int) -> int:
    """The clairvoyant optimum: evict the warm model needed again furthest in the future."""
    next_use = _next_uses(trace)
    swaps, warm = 0, set[str]()
    for index, request in enumerate(trace):
        if request.model in warm:
            continue
        swaps += 1
        if len(warm) == instances:
            warm.remove(max(warm, key=lambda m: next_use[index].get(m, float("inf"))))
        warm.add(request.model)
    return swaps


def _next_uses(trace: Sequence[Request]) -> list[dict[str, int]]:
    """For each position, the next index at which each model is requested (after it)."""
    upcoming: dict[str, int] = {}
    result: list[dict[str, int]] = [{}] * len(trace)
    for index in range(len(trace) - 1, -1, -1):
        result[index] = dict(upcoming)
        upcoming[trace[index].model] = index
    return result
