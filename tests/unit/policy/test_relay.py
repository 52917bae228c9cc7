"""The relay policy of docs/configuration.md (a model's `fallback` key) as a table."""

from __future__ import annotations

import pytest

from swapgate.policy.placement import Join, Queue, Serve, Swap, Unavailable
from swapgate.policy.relay import allows, relay_reason

DOWN = Unavailable("all down")


@pytest.mark.parametrize(
    ("policy", "decision", "expected_wait", "max_wait", "reason"),
    [
        ("off", DOWN, 0, 10, None),
        ("off", Swap("x"), 100, 10, None),
        ("error", Serve("x"), 0, 10, None),
        ("error", DOWN, 0, 10, "error"),
        ("error", Swap("x"), 100, 10, None),
        ("slow", DOWN, 0, 10, "error"),
        ("slow", Swap("x"), 11, 10, "slow"),
        ("slow", Join("x"), 11, 10, "slow"),
        ("slow", Queue("x"), 11, 10, "slow"),
        ("slow", Swap("x"), 9, 10, None),
        ("swap", Swap("x"), 1, 10, "swap"),
        ("swap", Join("x"), 1, 10, "swap"),
        ("swap", Queue("x"), 1, 10, "swap"),
        ("swap", Serve("x"), 0, 10, None),
        ("swap", DOWN, 0, 10, "error"),
    ],
)
def test_relay_reason(policy, decision, expected_wait, max_wait, reason) -> None:
    assert relay_reason(policy, decision, expected_wait, max_wait) == reason


def test_each_policy_includes_the_ones_before_it() -> None:
    table = {
        p: [allows(p, r) for r in ("error", "queue_full", "slow", "swap")]
        for p in ("off", "error", "slow", "swap")
    }
    assert table == {
        "off": [False, False, False, False],
        "error": [True, True, False, False],
        "slow": [True, True, True, False],
        "swap": [True, True, True, True],
    }
