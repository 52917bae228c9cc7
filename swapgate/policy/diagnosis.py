"""Is the decay local? One engine's figures, read as the soak method reads them
(docs/operations.md, "Is the decay local?"):

- TTFT p95 drifting above its own baseline, with the process's resident memory climbing:
  ``kv-growth`` (the KV pool grows, fragments; a restart gives it back);
- TTFT drifting with memory flat: ``placement-or-preemption`` (something else takes the
  engine's time: a neighbour on the GPU, preempted sequences, a bad placement);
- TTFT drifting and the relay drifting as much: ``global`` (the network, the clients, the
  prompts: not the engine);
- else ``healthy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["healthy", "kv-growth", "placement-or-preemption", "global"]
STATES: tuple[State, ...] = ("healthy", "kv-growth", "placement-or-preemption", "global")


@dataclass(frozen=True, slots=True)
class Figures:
    """What one engine (an instance's model) measured; None where there is too little yet."""

    ttft_p50: float | None = None  # seconds, over the rolling window
    ttft_p95: float | None = None
    baseline_p95: float | None = None  # over the baseline after its load, same prompt band
    band: str | None = None  # the prompt-size band both are of
    requests_per_second: float = 0.0
    rss_slope: float | None = None  # bytes per hour (kind: process only)
    relay_p50: float | None = None  # the probe's, to the model's relay
    relay_drift: float | None = None  # its recent p50 / its baseline p50
    # Its memory grew past its recycle_rss_slope: it is restarted (or was, within the window)
    outgrown: bool = False

    @property
    def drift(self) -> float | None:
        if self.ttft_p95 is None or not self.baseline_p95:
            return None
        return self.ttft_p95 / self.baseline_p95


def diagnose(figures: Figures, drift: float, memory_slope: float) -> State:
    """``drift``: the TTFT ratio that counts as decay; ``memory_slope``: bytes per hour from
    which memory is growing, not flat. An engine restarted for its memory slope is
    ``kv-growth`` whatever its TTFT: recycling cuts the leak short before it drifts."""
    if figures.outgrown:
        return "kv-growth"
    ratio = figures.drift
    if ratio is None or ratio < drift:
        return "healthy"
    if figures.relay_drift is not None and figures.relay_drift >= drift:
        return "global"
    if figures.rss_slope is not None and figures.rss_slope >= memory_slope:
        return "kv-growth"
    return "placement-or-preemption"
