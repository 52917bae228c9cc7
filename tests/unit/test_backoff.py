from __future__ import annotations

from swapgate.policy.backoff import Backoff


def test_failed_swaps_back_off_doubling_and_success_resets() -> None:
    backoff = Backoff()
    backoffs = [backoff.failed("x") for _ in range(8)]
    assert backoffs == [5, 10, 20, 40, 80, 160, 300, 300]
    backoff.succeeded("x")
    assert backoff.failed("x") == 5


def test_each_instance_backs_off_on_its_own() -> None:
    backoff = Backoff()
    backoff.failed("x")
    backoff.failed("x")
    assert backoff.failed("y") == 5
