"""How long swaps take: the measured durations per instance, model and tier, and the ETAs they
feed (placement's residency and wake-or-load choice, keep-alives, ``Retry-After``, the starvation
rule)."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from swapgate.policy.timing import EXPECTED_SWAP

RECENT_SWAPS = 5
# A swap either loads a cold model or wakes one asleep (vLLM's sleep mode, docs/configuration.md).
Kind = Literal["load", "wake"]
EXPECTED_WAKE = 5.0  # a wake not measured yet is expected this long (or a load's ETA if less)


def _unknown_tier(model: str) -> str:
    return "unknown"


class SwapTimes:
    """The swap ETA per tier: median of the last five measured loads (or wakes, of a model
    asleep) of (instance, model), by where its weights were read from (``cached``: the page
    cache; ``cold``: disk; ``unknown``), else of its loads from anywhere. Before one was
    measured: ``expected`` (the operator's ``expected_swap``) if set, else what was measured
    nearest to it (swapgate/policy/timing.py): its loads elsewhere; else, where its weights'
    size is known and so is the rate other loads read theirs at, that size over that rate;
    else the other loads on its instance, else any."""

    def __init__(
        self,
        expected: float | None,
        sizes: Mapping[str, int] | None = None,
        tiers: Callable[[str], str] = _unknown_tier,
    ) -> None:
        """``sizes``: the bytes of each model's weights, where known (catalog.weight_bytes);
        ``tiers``: where a model's weights would be read from now (the host cache says:
        ``cached`` or ``cold``)."""
        self.expected = expected
        self.sizes = dict(sizes or {})
        self.tiers = tiers
        self._recent: dict[tuple[str, str, Kind, str], deque[float]] = {}
        self._latest: dict[tuple[str, str, Kind], float] = {}

    def record(
        self, instance: str, model: str, seconds: float, kind: Kind = "load", tier: str = "unknown"
    ) -> None:
        key = (instance, model, kind, tier)
        self._recent.setdefault(key, deque(maxlen=RECENT_SWAPS)).append(seconds)
        self._latest[instance, model, kind] = seconds

    def eta(self, instance: str, model: str, kind: Kind = "load", tier: str | None = None) -> float:
        """Seconds a swap of ``model`` onto ``instance`` is expected to take; a load from
        ``tier``, by default from where its weights would be read now."""
        if tier is None:
            tier = self.tiers(model) if kind == "load" else "unknown"
        recent = self._recent.get((instance, model, kind, tier))
        if not recent:  # not measured from that tier: from any
            tiers = [
                t
                for (i, m, k, _), t in self._recent.items()
                if (i, m, k) == (instance, model, kind)
            ]
            recent = deque(x for times in tiers for x in times)
        if recent:
            return statistics.median(recent)
        if kind == "wake":  # never expected to take longer than loading it
            return min(self.eta(instance, model), EXPECTED_WAKE)
        return self.expected if self.expected is not None else self._nearest(instance, model)

    def wake_eta(self, instance: str, model: str) -> float:
        """Seconds waking ``model``, asleep on ``instance``, is expected to take."""
        return self.eta(instance, model, "wake")

    def quickest(self, model: str, instances: Iterable[str]) -> float:
        """The quickest swap of ``model`` expected onto any of ``instances``."""
        return min((self.eta(name, model) for name in instances), default=self.eta("", model))

    def guessing(self) -> bool:
        """Whether a load's ETA would be the bare ``EXPECTED_SWAP``: no load measured yet and
        no ``expected_swap`` set. Waits still use it; nobody is told it as a figure."""
        return self.expected is None and not any(k == "load" for _, _, k in self._latest)

    def last(self, instance: str, model: str, kind: Kind = "load") -> float:
        """The last measured swap of (instance, model); 0 if none."""
        return self._latest.get((instance, model, kind), 0.0)

    def _nearest(self, instance: str, model: str) -> float:
        """The median of the latest loads of ``model`` elsewhere, else of other models on
        ``instance``, else of any; ``EXPECTED_SWAP`` before the first."""
        loads = {
            (i, m): seconds for (i, m, kind), seconds in self._latest.items() if kind == "load"
        }
        elsewhere = [t for (_, m), t in loads.items() if m == model]
        if elsewhere:
            return statistics.median(elsewhere)
        rates = [self.sizes[m] / t for (_, m), t in loads.items() if self.sizes.get(m) and t > 0]
        if self.sizes.get(model) and rates:  # its bytes at the rate the others read theirs
            return self.sizes[model] / statistics.median(rates)
        for near in ([t for (i, _), t in loads.items() if i == instance], list(loads.values())):
            if near:
                return statistics.median(near)
        return EXPECTED_SWAP
