"""What demand-aware eviction knows of a model's demand: when it was requested, gateway-wide,
and the gaps between its latest requests (docs/architecture.md, ``routing.eviction: demand``)."""

from __future__ import annotations

from dataclasses import dataclass

# How many of each model's latest gaps between requests demand-aware eviction learns from.
HISTORY = 64


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When a model was last requested, gateway-wide, and the gaps between its latest requests:
    what demand-aware eviction predicts its next request from."""

    last: float
    gaps: tuple[float, ...] = ()

    def counted(self, now: float) -> Arrivals:
        return Arrivals(now, (*self.gaps[1 - HISTORY :], now - self.last))

    def chance_within(self, now: float, horizon: float) -> float:
        """The chance of another request within ``horizon`` seconds, given how long the model
        has been idle: among its past gaps at least that long, the share that ended within the
        horizon. One more gap is assumed, ending within it with chance horizon / (idle +
        horizon): with little history, a model idle for a while is expected to stay idle about
        as long again. Within no time at all (a swap measured at 0 s), no chance."""
        idle = max(0.0, now - self.last)
        longer = [gap for gap in self.gaps if gap > idle]
        ended = sum(1 for gap in longer if gap <= idle + horizon)
        assumed = horizon / (idle + horizon) if horizon > 0 else 0.0
        return (ended + assumed) / (len(longer) + 1)
