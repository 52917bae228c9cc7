"""What each engine measures over time (docs/operations.md, "Is the decay local?"): time to first
token by prompt-size band against its own baseline, requests per second, the resident-memory
slope of a ``kind: process`` engine, and the probes' TTFT of the instances and relays.

A series belongs to one load of a model on an instance: when the model is loaded again (a swap,
a restart, a recycle) its baseline starts over. The request path adds one sample per streamed
answer (an append); figures are computed when read (``/admin/state``, a scrape).
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from swapgate.config.settings import DiagnosisConfig, ProcessCommand
from swapgate.data.counts import PerSecond
from swapgate.policy.diagnosis import Figures, State, diagnose

# Prompt-size bands (estimated tokens): long prompts take longer to their first token, so a
# batch of them is compared with long prompts, not read as decay.
BANDS = ((512, "short"), (4096, "medium"))
LONG = "long"
MIN_SAMPLES = 5  # per band, in the baseline and the window, before a drift is said
MIN_SPAN = 0.8  # of the slope's window its samples must cover: a slope "sustained"
SLOPE_POINTS = 3  # samples a slope needs: its window must span two poll intervals at least
HOUR = 3600.0
# Bounds on what one engine keeps, whatever its rate: a baseline is a uniform sample of its
# period (reservoir), the window its latest answers.
BASELINE_KEPT = 1024
RECENT_KEPT = 4096
PROBES_RECENT = 3  # a probe target's recent TTFT: the median of its last probes


def band(tokens: int) -> str:
    return next((name for limit, name in BANDS if tokens <= limit), LONG)


@dataclass(slots=True)
class _Series:
    """One load's samples."""

    since: float  # when it became warm: a new load starts a new series
    baseline: dict[str, list[float]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # baseline samples offered, per band
    recent: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    served: PerSecond = field(default_factory=PerSecond)
    rss: deque[tuple[float, int]] = field(default_factory=deque)
    slope_window: float = 0.0  # its process's own (slope_window), if it has one
    leaking: float | None = None  # its slope, past recycle_rss_slope at the last poll


@dataclass(slots=True)
class _Probes:
    """A probe target's TTFTs: those of its first ``baseline`` (a sample), and the last few."""

    started: float
    seen: dict[str, int] = field(default_factory=dict)
    baseline: list[float] = field(default_factory=list)
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=PROBES_RECENT))


class DecayWatch:
    def __init__(self, config: DiagnosisConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._series: dict[tuple[str, str], _Series] = {}
        self._probes: dict[str, _Probes] = {}
        # (instance, model): the slope an engine was last restarted for, and when: shown
        # through the restart and the next load's first minutes, until they measure their own
        self._leaks: dict[tuple[str, str], tuple[float, float]] = {}

    def configure(self, config: DiagnosisConfig) -> None:
        self.config = config

    def _of(self, instance: str, model: str, since: float) -> _Series:
        key = (instance, model)
        series = self._series.get(key)
        if series is None or series.since != since:
            series = self._series[key] = _Series(since)
        return series

    # -- samples -------------------------------------------------------------------------------

    def ttft(self, instance: str, model: str, since: float, tokens: int, seconds: float) -> None:
        """A streamed answer's first token ``seconds`` after it was sent, for a prompt of
        about ``tokens``, from the load of ``model`` warm since ``since``."""
        now = self._clock()
        series = self._of(instance, model, since)
        name = band(tokens)
        baseline = series.baseline.setdefault(name, [])
        # Its first ``baseline`` seconds, or longer if they held too few answers to compare with
        if now - since <= self.config.baseline or len(baseline) < MIN_SAMPLES:
            _keep(baseline, series.seen, name, seconds)
        recent = series.recent.setdefault(name, deque(maxlen=RECENT_KEPT))
        recent.append((now, seconds))
        _trim(recent, now - self.config.window)

    def served(self, instance: str, model: str, since: float) -> None:
        """One request answered by the load of ``model`` warm since ``since``."""
        self._of(instance, model, since).served.add(self._clock(), self.config.window)

    def rss(self, instance: str, model: str, since: float, rss: int, keep: float) -> None:
        """A process group's resident size; ``keep``: how far back the slope may look."""
        now = self._clock()
        series = self._of(instance, model, since)
        series.slope_window = keep
        samples = series.rss
        samples.append((now, rss))
        _trim(samples, now - max(keep, self.config.window), anchor=True)

    def outgrown(
        self, instance: str, model: str, since: float, rss: int, command: ProcessCommand | None
    ) -> float | None:
        """A process group's resident size, measured: its slope in bytes per hour once it was
        at or past its command's ``recycle_rss_slope`` at two polls in a row (restart it),
        else None. The first of them shows the slope and ``kv-growth`` before the restart."""
        self.rss(instance, model, since, rss, command.slope_window if command else 0.0)
        if command is None or command.recycle_rss_slope is None:
            return None
        series = self._series[instance, model]
        slope = self.slope(instance, model, command.slope_window)
        if slope is None or slope < command.recycle_rss_slope:
            series.leaking = None
            return None
        self._leaks[instance, model] = (slope, self._clock())
        sustained, series.leaking = series.leaking is not None, slope
        return slope if sustained else None

    def probe(self, target: str, seconds: float) -> None:
        now = self._clock()
        probes = self._probes.get(target)
        if probes is None:
            probes = self._probes[target] = _Probes(now)
        if now - probes.started <= self.config.baseline:
            _keep(probes.baseline, probes.seen, target, seconds)
        probes.recent.append((now, seconds))

    # -- figures -------------------------------------------------------------------------------

    def slope(self, instance: str, model: str, window: float) -> float | None:
        """Bytes per hour over the last ``window`` seconds, if the samples cover most of it: those
        in it and the last one before it (samples a poll interval apart never fall on its start,
        so without that one a 20 s window at 5 s polls holds 15 s of samples)."""
        series = self._series.get((instance, model))
        if series is None:
            return None
        now = self._clock()
        start = next((i for i, (t, _) in enumerate(series.rss) if t >= now - window), None)
        if start is None:
            return None
        points = list(series.rss)[max(0, start - 1) :]
        if len(points) < SLOPE_POINTS or points[-1][0] - points[0][0] < MIN_SPAN * window:
            return None
        return _least_squares(points) * HOUR

    def figures(self, instance: str, model: str, relay: str | None = None) -> Figures:
        series = self._series.get((instance, model))
        relay_p50, relay_drift = self._probe_figures(f"relay/{relay}") if relay else (None, None)
        now = self._clock()
        window = self.config.window
        leak = self._leaks.get((instance, model))
        if leak is not None and now - leak[1] > window:
            leak = None  # restarted for its slope longer ago than the window looks back
        if series is None:
            leaked = leak[0] if leak else None
            return Figures(
                rss_slope=leaked, relay_p50=relay_p50, relay_drift=relay_drift, outgrown=bool(leak)
            )
        rss_slope = self.slope(instance, model, window)
        if rss_slope is None and series.slope_window:  # a process restarted on its own slope
            rss_slope = self.slope(instance, model, min(window, series.slope_window))
        if rss_slope is None and leak is not None:
            rss_slope = leak[0]
        outgrown = leak is not None
        rate = series.served.count(now, window) / window
        chosen = _band_to_compare(series, now - window)
        p50 = p95 = base = None
        if chosen is not None:
            recent = [s for t, s in series.recent[chosen] if t >= now - window]
            p50, p95 = _quantile(recent, 0.5), _quantile(recent, 0.95)
            # No drift against a baseline still being taken: a slowdown then would be its own
            # baseline
            if now - series.since > self.config.baseline:
                base = _quantile(series.baseline[chosen], 0.95)
        return Figures(p50, p95, base, chosen, rate, rss_slope, relay_p50, relay_drift, outgrown)

    def _probe_figures(self, target: str) -> tuple[float | None, float | None]:
        """The median of the last ``PROBES_RECENT`` probes, and its ratio to the baseline's
        median once the baseline is over. By count, not by window: probes are few (one every
        ``probe_interval``, 5 min say), and the window would hold one or two."""
        probes = self._probes.get(target)
        if probes is None or not probes.recent:
            return None, None
        p50 = statistics.median(s for _, s in probes.recent)
        after_baseline = self._clock() - probes.started > self.config.baseline
        enough = len(probes.baseline) >= PROBES_RECENT and len(probes.recent) >= PROBES_RECENT
        base = statistics.median(probes.baseline) if enough and after_baseline else None
        return p50, (p50 / base if base else None)

    def diagnosis(self, instance: str, model: str, relay: str | None) -> tuple[State, Figures]:
        figures = self.figures(instance, model, relay)
        config = self.config
        return diagnose(figures, config.drift, config.memory_slope), figures

    def describe(self, instance: str, model: str, relay: str | None) -> dict[str, object]:
        """The diagnosis with the figures behind it, for /admin/state."""
        state, f = self.diagnosis(instance, model, relay)
        return {
            "state": state,
            "ttft_p50_ms": _ms(f.ttft_p50),
            "ttft_p95_ms": _ms(f.ttft_p95),
            "ttft_baseline_p95_ms": _ms(f.baseline_p95),
            "ttft_drift_ratio": round(f.drift, 3) if f.drift is not None else None,
            "prompt_band": f.band,
            "requests_per_second": round(f.requests_per_second, 3),
            "rss_slope_bytes_per_hour": round(f.rss_slope) if f.rss_slope is not None else None,
            "relay_ttft_p50_ms": _ms(f.relay_p50),
            "relay_drift_ratio": round(f.relay_drift, 3) if f.relay_drift is not None else None,
        }

    def forget_gone(self, warm: set[tuple[str, str]]) -> None:
        """Drop the series of engines no longer warm."""
        for key in [k for k in self._series if k not in warm]:
            del self._series[key]


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 1) if seconds is not None else None


def _keep(kept: list[float], seen: dict[str, int], name: str, value: float) -> None:
    """Reservoir sampling: every value offered has the same chance to be kept."""
    seen[name] = count = seen.get(name, 0) + 1
    if len(kept) < BASELINE_KEPT:
        kept.append(value)
    elif (slot := random.randrange(count)) < BASELINE_KEPT:
        kept[slot] = value


def _trim(
    samples: deque[tuple[float, float]] | deque[tuple[float, int]],
    oldest: float,
    anchor: bool = False,
) -> None:
    """Drop samples older than ``oldest``; with ``anchor``, all but the last of those (where a
    slope over the window starts)."""
    while len(samples) > (1 if anchor else 0) and samples[int(anchor)][0] < oldest:
        samples.popleft()


def _band_to_compare(series: _Series, oldest: float) -> str | None:
    """The band with the most recent samples among those with enough in both the baseline and
    the window."""
    counts = {
        name: sum(1 for t, _ in samples if t >= oldest)
        for name, samples in series.recent.items()
        if len(series.baseline.get(name, ())) >= MIN_SAMPLES
    }
    enough = {name: n for name, n in counts.items() if n >= MIN_SAMPLES}
    return max(enough, key=lambda name: enough[name]) if enough else None


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def _least_squares(points: list[tuple[float, int]]) -> float:
    """The slope of the line through ``points`` (per second)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
