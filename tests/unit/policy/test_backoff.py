"""The backoff rules (swapgate/policy/backoff.py) on a fake clock: a model alone backs off
alone; two of an instance's models failing within the window back off the instance."""

from __future__ import annotations

from swapgate.policy.backoff import Backoff, Verdict
from tests.unit.fakes import FakeClock


def test_one_model_failing_backs_off_that_model_alone_doubling_and_a_success_resets() -> None:
    backoff = Backoff(FakeClock(0.0))
    verdicts = [backoff.failed("x", "broken") for _ in range(8)]
    assert [v.model for v in verdicts] == [5, 10, 20, 40, 80, 160, 300, 300]
    assert all(v.instance == 0 for v in verdicts)  # the instance keeps serving its others
    backoff.succeeded("x", "broken")
    assert backoff.failed("x", "broken") == Verdict(5)


def test_two_models_failing_within_the_window_back_off_the_instance() -> None:
    clock = FakeClock(0.0)
    backoff = Backoff(clock, window=60.0)
    assert backoff.failed("x", "a") == Verdict(5)
    clock.advance(59.0)
    assert backoff.failed("x", "b") == Verdict(5, 5)
    clock.advance(1.0)
    assert backoff.failed("x", "a") == Verdict(10, 10)  # the instance's count doubles too


def test_failures_further_apart_than_the_window_stay_each_models_own() -> None:
    clock = FakeClock(0.0)
    backoff = Backoff(clock, window=60.0)
    backoff.failed("x", "a")
    clock.advance(61.0)
    assert backoff.failed("x", "b") == Verdict(5)


def test_each_instance_and_model_counts_on_its_own() -> None:
    backoff = Backoff(FakeClock(0.0))
    backoff.failed("x", "a")
    backoff.failed("x", "a")
    assert backoff.failed("y", "a") == Verdict(5)  # another instance: its own count
    assert backoff.failed("y", "b").model == 5  # another model: its own (the instance's: 5)


def test_a_model_that_loads_again_no_longer_counts_towards_its_instance() -> None:
    clock = FakeClock(0.0)
    backoff = Backoff(clock)
    backoff.failed("x", "a")
    backoff.succeeded("x", "a")
    assert backoff.failed("x", "b") == Verdict(5)
