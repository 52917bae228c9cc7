"""How long a model whose load failed stays out of placement on that instance, and when the
instance as a whole does (docs/architecture.md, "Backoff, and failure isolation").

A failed load of model M on instance I backs off (I, M) alone: 5 s after one failure, doubling
with each failure in a row, at most 5 minutes; a load that works resets it. I keeps serving and
loading its other models. I itself backs off only when two or more of its models failed within
``window`` (``routing.backoff_window``): then the fault is likelier the instance's than one
model's. (An instance that does not answer its polls is down, which the poller says.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

FIRST = 5.0
MOST = 300.0
WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one failure costs: seconds ``model`` stays out on its instance, and seconds the
    whole instance does (0: it keeps serving and loading its other models)."""

    model: float
    instance: float = 0.0


class Backoff:
    def __init__(
        self,
        clock: Callable[[], float],
        window: float = WINDOW,
        first: float = FIRST,
        most: float = MOST,
    ) -> None:
        self._clock = clock
        self.window = window
        self._first = first
        self._most = most
        self._steps: dict[tuple[str, str | None], float] = {}  # (instance, model or None)
        self._failed_at: dict[str, dict[str, float]] = {}  # instance -> model -> last failure

    def failed(self, instance: str, model: str) -> Verdict:
        """A load of ``model`` on ``instance`` failed now."""
        now = self._clock()
        recent = self._failed_at.setdefault(instance, {})
        recent[model] = now
        for other, at in list(recent.items()):
            if now - at > self.window:
                del recent[other]
        whole = self._step((instance, None)) if len(recent) >= 2 else 0.0
        return Verdict(self._step((instance, model)), whole)

    def succeeded(self, instance: str, model: str) -> None:
        """A load of ``model`` on ``instance`` worked: both its own and the instance's count
        start again."""
        self._steps.pop((instance, model), None)
        self._steps.pop((instance, None), None)
        self._failed_at.get(instance, {}).pop(model, None)

    def _step(self, key: tuple[str, str | None]) -> float:
        step = min(max(self._steps.get(key, 0.0) * 2, self._first), self._most)
        self._steps[key] = step
        return step
