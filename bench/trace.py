"""Seeded traces of a realistic day, and offline scorers that count the swaps each strategy needs.

A day has four workloads, each on its own model(s): short interactive bursts (a team chatting
with one of two chat models), steady medium traffic (a coding assistant), blocks of long batch
prompts (a nightly-style job, a few times a day) and a long tail of rarely used models (vision,
SQL, translation: a request or two every few minutes). There are more models than instances, and
their rates differ by an order of magnitude: the traffic on which victim choice matters.
Scorers see the whole trace at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

TIME_LIMIT = 60.0  # seconds the solver may take; then its proven lower bound is the answer
TAIL = ("vision", "sql", "translate")
MODELS = ("chat-a", "chat-b", "coder", "rag", "batch", *TAIL)


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
    t = 0.0
    while t < duration:  # steady light traffic: often idle longer than min_residency
        t += dice.expovariate(1 / 45)
        requests.append(Request(t, "rag", dice.randint(20, 60)))
    t = dice.uniform(0, duration / 4)
    while t < duration:  # blocks of long batch prompts
        for i in range(dice.randint(10, 25)):
            requests.append(
                Request(t + i * dice.uniform(1.0, 3.0), "batch", dice.randint(150, 300))
            )
        t += dice.uniform(duration / 5, duration / 3)
    for model in TAIL:  # the long tail: one to three requests, every few minutes
        t = dice.uniform(0, 240)
        while t < duration:
            for _ in range(dice.randint(1, 3)):
                requests.append(Request(t + dice.uniform(0, 10), model, dice.randint(30, 90)))
            t += dice.expovariate(1 / 300)
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


def optimum(trace: Sequence[Request], instances: int, max_wait: float, swap_time: float) -> int:
    """The fewest swaps any schedule needs, however clairvoyant, if it may hold each request up to
    ``max_wait`` seconds and so reorder and group them as it likes: a lower bound, solved exactly
    as an integer program (HiGHS, through SciPy).

    Time runs in steps of half a swap. n[t, m] is how many instances hold model m in step t, at
    most ``instances`` in all; a model is usable in step t only if it was held in step t - 1 too (a
    swap takes two steps); every request needs its model usable in some step between its arrival
    and ``max_wait`` later; each increase of n is a swap. The relaxations (instant service, no
    throughput limit, any instance's copy counts) only make the bound lower. Should the solver
    run out of ``TIME_LIMIT``, the bound it has proven so far is returned: still a lower bound.
    """
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_array

    step = swap_time / 2
    models = sorted({r.model for r in trace})
    windows = _windows(trace, step, max_wait)
    steps = max(b for _, _, b in windows) + 1
    size = steps * len(models)  # variables: n, then u (usable), then s (swaps), each [t, m]

    def n(t: int, m: int) -> int:
        return t * len(models) + m

    rows = lil_array((steps + 3 * size + len(windows), 3 * size))
    low, high, row = list[float](), list[float](), 0
    for t in range(steps):
        for m in range(len(models)):
            rows[row, n(t, m)] = 1
        low.append(-np.inf)
        high.append(instances)
        row += 1
    for t in range(steps):
        for m in range(len(models)):
            rows[row, 2 * size + n(t, m)], rows[row, n(t, m)] = 1, -1  # s >= n[t] - n[t-1]
            rows[row + 1, size + n(t, m)], rows[row + 1, n(t, m)] = 1, -1  # u <= n[t]
            rows[row + 2, size + n(t, m)] = 1  # u <= n[t-1]
            if t:
                rows[row, n(t - 1, m)] = 1
                rows[row + 2, n(t - 1, m)] = -1
            low += [0, -np.inf, -np.inf]
            high += [np.inf, 0, 0]
            row += 3
    for model, a, b in windows:
        for t in range(a, b + 1):
            rows[row, size + n(t, models.index(model))] = 1
        low.append(1)
        high.append(np.inf)
        row += 1
    cost = np.concatenate([np.zeros(2 * size), np.ones(size)])
    upper = np.concatenate([np.full(size, instances), np.ones(size), np.full(size, np.inf)])
    result = milp(
        cost,
        constraints=LinearConstraint(rows.tocsr()[:row], low, high),
        integrality=np.concatenate([np.ones(size), np.zeros(2 * size)]),
        bounds=Bounds(0, upper),
        options={"time_limit": TIME_LIMIT},
    )
    if result.status == 1 and result.mip_dual_bound is not None:  # out of time: the proven bound
        return math.ceil(float(result.mip_dual_bound) - 1e-6)
    if result.status != 0:
        raise RuntimeError(f"the optimum was not found: {result.message}")
    return round(float(result.fun))


def _windows(trace: Sequence[Request], step: float, max_wait: float) -> list[tuple[str, int, int]]:
    """Each request's steps (model, first, last), without those that contain another of the same
    model's: covering the inner one covers the outer one."""
    spans = sorted({(r.model, int(r.at // step), int((r.at + max_wait) // step)) for r in trace})
    kept: list[tuple[str, int, int]] = []
    for model, a, b in spans:  # sorted by start: an inner window starts no earlier
        while kept and kept[-1][0] == model and kept[-1][2] >= b:
            kept.pop()
        kept.append((model, a, b))
    return kept
