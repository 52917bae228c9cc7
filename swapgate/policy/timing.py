"""Routing times that follow the measured swaps when the operator set none (issue 23).

``min_residency``, ``expected_swap`` and the starvation point were absolute times chosen for
30 s swaps: behind 1 s wakes they made requests wait out a 30 s residency, behind 60 s loads
they let a model be evicted half-way through paying for itself. Unset, each is a number of the
measured swap times it guards instead; a value in the config is used as it is.

- residency of (instance, model): ``RESIDENCY_SWAPS`` × its measured swap there, within
  ``RESIDENCY_BOUNDS`` — a model earns back what loading it cost before it may be evicted;
- the expected swap of an (instance, model) never measured: the median of what was measured
  nearest to it (the model on other instances, then other models on the instance, then any
  swap), ``EXPECTED_SWAP`` before the first swap of all;
- the starvation point of a model: ``STARVATION_SWAPS`` × its swap time, and never later than
  ``STARVATION_AFTER`` of its ``max_wait`` (the rule as configured before).
"""

from __future__ import annotations

import math

EXPECTED_SWAP = 30.0  # before any swap was measured (docs/configuration.md's expected_swap)
RESIDENCY_SWAPS = 1.0
RESIDENCY_BOUNDS = (0.25, 300.0)  # the floor guards against a load measured at ~0 s
STARVATION_SWAPS = 1.0
STARVATION_AFTER = 0.25  # of max_wait: the latest a request waits before a busy model closes
STARVATION_FLOOR = 0.25  # seconds: closing a busy model sooner than this buys nothing


def residency(configured: float | None, swap_seconds: float) -> float:
    """How long a model that served a request stays unevictable."""
    if configured is not None:
        return configured
    low, high = RESIDENCY_BOUNDS
    return min(high, max(low, RESIDENCY_SWAPS * swap_seconds))


def starvation_point(starvation_after: float | None, max_wait: float, swap_seconds: float) -> float:
    """How long a request may wait for room before the starvation rule closes a busy model."""
    if starvation_after is not None:
        return max_wait * starvation_after
    latest = max_wait * STARVATION_AFTER
    return min(latest, max(STARVATION_FLOOR, STARVATION_SWAPS * swap_seconds))


def remaining(done_by: float, began: float, now: float) -> int:
    """Whole seconds a running swap is still expected to take, as keep-alives tell it: the
    expected end counted down, never 0 while it runs. One that outlasts its expectation is
    expected to take half as long again as it has run (the estimate was wrong; how long it
    has already run is the best guide left)."""
    left = done_by - now
    if left >= 1.0:
        return math.ceil(left)
    return max(1, math.ceil((now - began) / 2))


def retry_after(value: str | None, default: float = 1.0, most: float = 10.0) -> float:
    """Seconds an instance's ``Retry-After`` asks for (its seconds form), within reason."""
    try:
        return min(max(float(value or default), 0.1), most)
    except ValueError:
        return default
