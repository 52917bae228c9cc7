"""Engine decay (docs/operations.md, "Is the decay local?"): TTFT against its baseline by prompt
band, the memory slope, the probes, and the diagnosis they make."""

from __future__ import annotations

import pytest

from swapgate.config.settings import DiagnosisConfig, ProcessCommand, parse_rate
from swapgate.control.loops.decay import BASELINE_KEPT, RECENT_KEPT, DecayWatch, band
from swapgate.policy.diagnosis import Figures, diagnose
from tests.unit.fakes import FakeClock

CONFIG = DiagnosisConfig(baseline=60, window=60, drift=1.5, memory_slope=100 * 2**20)
MIB = 2**20


def watch() -> tuple[DecayWatch, FakeClock]:
    clock = FakeClock(0.0)
    return DecayWatch(CONFIG, clock), clock


def feed(decay: DecayWatch, clock: FakeClock, ttft: float, count: int, tokens: int = 10) -> None:
    for _ in range(count):
        clock.advance(1)
        decay.ttft("gpu", "m", 0.0, tokens, ttft)
        decay.served("gpu", "m", 0.0)


@pytest.mark.parametrize(
    ("figures", "state"),
    [
        (Figures(), "healthy"),  # too little yet
        (Figures(ttft_p95=0.12, baseline_p95=0.1), "healthy"),
        (Figures(ttft_p95=0.3, baseline_p95=0.1, rss_slope=500 * MIB), "kv-growth"),
        (Figures(ttft_p95=0.3, baseline_p95=0.1, rss_slope=5 * MIB), "placement-or-preemption"),
        (Figures(ttft_p95=0.3, baseline_p95=0.1), "placement-or-preemption"),
        (Figures(ttft_p95=0.3, baseline_p95=0.1, rss_slope=500 * MIB, relay_drift=2.0), "global"),
        (Figures(ttft_p95=0.3, baseline_p95=0.1, relay_drift=1.1), "placement-or-preemption"),
        (Figures(ttft_p95=0.1, baseline_p95=0.1, rss_slope=900 * MIB), "healthy"),
        # Restarted for its memory slope: recycling cuts the leak short before TTFT drifts
        (Figures(rss_slope=900 * MIB, outgrown=True), "kv-growth"),
    ],
)
def test_the_soak_rule(figures: Figures, state: str) -> None:
    assert diagnose(figures, 1.5, 100 * MIB) == state


def test_ttft_is_compared_with_its_own_baseline_after_the_load() -> None:
    decay, clock = watch()
    feed(decay, clock, 0.10, 50)  # the baseline: the first minute after the load
    clock.advance(60)
    feed(decay, clock, 0.30, 30)
    figures = decay.figures("gpu", "m")
    assert figures.baseline_p95 == pytest.approx(0.10)
    assert figures.ttft_p95 == pytest.approx(0.30)
    assert figures.drift == pytest.approx(3.0)
    assert figures.requests_per_second == pytest.approx(0.5)
    assert decay.diagnosis("gpu", "m", None)[0] == "placement-or-preemption"


def test_a_slowdown_while_the_baseline_is_taken_shows_as_drift_once_it_is_over() -> None:
    decay, clock = watch()
    feed(decay, clock, 0.10, 20)
    feed(decay, clock, 0.30, 30)  # still in the first minute: the baseline takes these too
    figures = decay.figures("gpu", "m")
    assert figures.ttft_p95 == pytest.approx(0.30)
    assert (figures.baseline_p95, figures.drift) == (None, None)
    assert decay.diagnosis("gpu", "m", None)[0] == "healthy"
    clock.advance(10)  # the minute is over
    feed(decay, clock, 0.60, 30)
    assert decay.figures("gpu", "m").drift == pytest.approx(2.0)  # against the slowed baseline


def test_a_baseline_that_saw_too_few_answers_takes_the_next_ones() -> None:
    decay, clock = watch()
    feed(decay, clock, 0.10, 2)  # a quiet first minute: two answers
    clock.advance(120)
    feed(decay, clock, 0.12, 3)  # complete the baseline's five
    feed(decay, clock, 0.40, 10)
    figures = decay.figures("gpu", "m")
    assert figures.baseline_p95 == pytest.approx(0.12)
    assert figures.drift == pytest.approx(0.40 / 0.12)


def test_long_prompts_are_compared_with_long_prompts() -> None:
    decay, clock = watch()
    feed(decay, clock, 0.1, 20)
    feed(decay, clock, 2.0, 20, tokens=8000)  # long prompts, slow from the start
    clock.advance(60)
    feed(decay, clock, 2.0, 10, tokens=8000)  # a batch of them later: the same as before
    figures = decay.figures("gpu", "m")
    assert figures.band == "long"
    assert figures.drift == pytest.approx(1.0)
    assert decay.diagnosis("gpu", "m", None)[0] == "healthy"
    assert [band(100), band(2000), band(9000)] == ["short", "medium", "long"]


def test_a_new_load_starts_a_new_baseline() -> None:
    decay, clock = watch()
    feed(decay, clock, 0.1, 30)
    clock.advance(60)
    feed(decay, clock, 0.5, 30)
    assert decay.diagnosis("gpu", "m", None)[0] == "placement-or-preemption"
    decay.ttft("gpu", "m", clock.now, 10, 0.5)  # warm again since now: restarted
    assert decay.figures("gpu", "m").drift is None, "no baseline yet"


def test_the_memory_slope_is_bytes_per_hour_once_it_covers_its_window() -> None:
    decay, clock = watch()
    for second in range(0, 31, 5):
        clock.now = float(second)
        decay.rss("node", "m", 0.0, 100 * MIB + second * MIB, keep=30)
    assert decay.slope("node", "m", 30) == pytest.approx(3600 * MIB)
    assert decay.slope("node", "m", 120) is None, "30 s of samples do not sustain 2 minutes"


def test_a_window_of_four_polls_is_measured_though_no_poll_falls_on_its_start() -> None:
    # 5 s polls a little off the second, a 20 s slope_window: the window never starts on a
    # sample, so it holds 4 of them over 15 s; the one before it makes the slope sustained.
    decay, clock = watch()
    for poll in range(12):
        clock.now = poll * 5.0 + 0.3
        decay.rss("node", "m", 0.0, 100 * MIB + poll * 8 * MIB, keep=20)
    clock.now += 0.1  # read a moment after the last poll
    assert decay.slope("node", "m", 20) == pytest.approx(8 * MIB / 5 * 3600)


def test_the_diagnosis_keeps_its_own_window_of_memory_when_slope_window_is_shorter() -> None:
    decay, clock = watch()  # the diagnosis window: 60 s
    for poll in range(16):
        clock.now = poll * 5.0 + 0.3
        decay.rss("node", "m", 0.0, 100 * MIB + poll * 8 * MIB, keep=20)
    assert decay.figures("node", "m").rss_slope == pytest.approx(8 * MIB / 5 * 3600)


def test_a_leak_cut_short_by_recycling_shows_its_slope_and_kv_growth_before_and_after() -> None:
    """A 20 s slope_window, 1 s polls, the diagnosis over 10 minutes (the default): the slope
    shows from the first poll past recycle_rss_slope, the restart comes at the next, and the
    next load shows the slope it was restarted for until it measures its own."""
    decay = DecayWatch(DiagnosisConfig(window=600, memory_slope=100 * MIB), clock := FakeClock(0.0))
    command = ProcessCommand(cmd="engine", recycle_rss_slope="1GiB/h", slope_window="20s")
    restart, shown = None, []
    for second in range(40):
        clock.now = float(second)
        rss = 100 * MIB + second * 8 * MIB  # 8 MiB a second: 28 GiB/h
        if decay.outgrown("node", "m", 0.0, rss, command) is not None:
            restart = second
            break
        shown.append(decay.diagnosis("node", "m", None)[0])
    assert restart is not None
    assert shown[-1] == "kv-growth", "shown at the poll before the restart"
    assert shown[:-1] == ["healthy"] * (len(shown) - 1)
    slope = decay.figures("node", "m").rss_slope
    assert slope == pytest.approx(8 * MIB * 3600)
    clock.advance(2)  # the new load: too few samples of its own yet
    decay.outgrown("node", "m", clock.now, 100 * MIB, command)
    after = decay.figures("node", "m")
    assert (after.rss_slope, after.outgrown) == (slope, True)
    clock.advance(601)
    decay.outgrown("node", "m", 2.0, 100 * MIB, command)  # flat since
    assert decay.diagnosis("node", "m", None)[0] == "healthy", "the leak is over"


def test_the_relay_probe_drifts_against_its_own_baseline() -> None:
    decay, clock = watch()
    for _ in range(10):
        clock.advance(5)
        decay.probe("relay/cloud", 0.035)
    clock.advance(60)
    for _ in range(10):
        clock.advance(5)
        decay.probe("relay/cloud", 0.035 * 3)
    figures = decay.figures("gpu", "m", relay="cloud")
    assert figures.relay_p50 == pytest.approx(0.105)
    assert figures.relay_drift == pytest.approx(3.0)


def test_baselines_keep_a_bounded_sample_whatever_the_rate() -> None:
    decay, clock = watch()
    for _ in range(20_000):
        clock.advance(0.001)
        decay.ttft("gpu", "m", 0.0, 10, 0.1)
    kept = decay._series[("gpu", "m")]  # what it holds is the point
    assert set(kept.baseline["short"]) == {0.1}
    assert len(kept.baseline["short"]) == BASELINE_KEPT
    assert len(kept.recent["short"]) <= RECENT_KEPT


@pytest.mark.parametrize(
    ("text", "per_hour"),
    [("500MiB/h", 500 * MIB), ("10MiB/m", 600 * MIB), ("1MiB/s", 3600 * MIB), (1024, 1024)],
)
def test_rates_read_per_hour_minute_or_second(text: object, per_hour: float) -> None:
    assert parse_rate(text) == per_hour


def test_a_rate_without_its_unit_of_time_says_how_to_write_it() -> None:
    with pytest.raises(ValueError, match="500MiB/h"):
        parse_rate("500MiB")


def test_probes_every_five_minutes_still_tell_the_relays_drift() -> None:
    clock = FakeClock(0.0)
    decay = DecayWatch(DiagnosisConfig(), clock)  # baseline 1 h, window 10 min
    for _ in range(12):
        decay.probe("relay/cloud", 0.035)
        clock.advance(300)
    for _ in range(3):
        decay.probe("relay/cloud", 0.105)
        clock.advance(300)
    figures = decay.figures("gpu", "m", relay="cloud")
    assert figures.relay_drift == pytest.approx(3.0), "a 10-minute window holds two probes"
