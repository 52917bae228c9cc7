"""Idle unload's pure rules (swapgate/policy/idle_timeout.py): Ollama's keep_alive forms, the
timeout in force, and when a copy may go."""

from __future__ import annotations

import pytest

from swapgate.data.snapshot import InstanceView, ModelView
from swapgate.data.warm import WarmState
from swapgate.policy.idle_timeout import Timeout, parse_keep_alive, timeout_of, unload_at


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (300, 300.0),
        (2.5, 2.5),
        ("300", 300.0),
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (-1, None),
        ("-1", None),
        ("-1m", None),
        (10**400, None),
    ],
)
def test_keep_alive_reads_ollamas_forms(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "", "m", "5x", True, None, [5], {"s": 1}])
def test_a_keep_alive_that_is_no_duration_is_refused_saying_what_to_send(value: object) -> None:
    with pytest.raises(ValueError, match=r"not a duration: .*use e\.g\. \"5m\""):
        parse_keep_alive(value)


@pytest.mark.parametrize(
    ("ttl", "asked", "was_asked", "timeout"),
    [
        (0.0, None, False, Timeout(None, "ttl")),  # no ttl: never
        (120.0, None, False, Timeout(120.0, "ttl")),
        (120.0, 0.0, True, Timeout(0.0, "keep_alive")),  # 0: right after the answer
        (120.0, None, True, Timeout(None, "keep_alive")),  # -1: kept, despite the ttl
        (0.0, 600.0, True, Timeout(600.0, "keep_alive")),  # asked on a model with no ttl
    ],
)
def test_the_last_requests_keep_alive_replaces_the_ttl(
    ttl: float, asked: float | None, was_asked: bool, timeout: Timeout
) -> None:
    assert timeout_of(ttl, asked, was_asked) == timeout


NOW = 1000.0
TTL = Timeout(10.0, "ttl")


def copy(**fields: object) -> ModelView:
    values: dict[str, object] = {
        "state": WarmState.WARM,
        "since": NOW - 100,
        "last_used": NOW - 4,
        "inflight": 0,
        "pinned_until": 0.0,
    }
    values.update(fields)
    return ModelView(**values)  # type: ignore[arg-type]


def instance(view: ModelView, **fields: object) -> InstanceView:
    values: dict[str, object] = {
        "name": "gpu",
        "up": True,
        "drained": False,
        "capacity": 1,
        "weight": 1.0,
        "inflight": view.inflight,
        "serves": frozenset({"m"}),
        "models": {"m": view},
        "swapping": None,
        "swap_done_by": 0.0,
        "backoff_until": 0.0,
    }
    values.update(fields)
    return InstanceView(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("view", "place", "at"),
    [
        (copy(), {}, NOW + 6),  # idle 4 s of its 10
        (copy(last_used=NOW - 30), {}, NOW - 20),  # overdue: at once
        (copy(last_used=0.0, since=NOW - 2), {}, NOW + 8),  # never used: idle since its load
        (copy(inflight=1), {}, None),  # serves a request
        (copy(waiting=2), {}, None),  # requests wait for it
        (copy(closing=True), {}, None),  # another rule closes it
        (copy(state=WarmState.LOADING), {}, None),
        (copy(state=WarmState.ASLEEP), {}, None),
        (copy(pinned_until=NOW + 50), {}, NOW + 60),  # pinned: its idle time starts at the end
        (copy(pinned_until=float("inf")), {}, None),  # pinned for ever
        (copy(pinned_until=NOW - 1, last_used=NOW - 30), {}, NOW + 9),  # the pin just ended
        (copy(), {"up": False}, None),
        (copy(), {"swapping": "other"}, None),
        (copy(), {"evicting": True}, None),
    ],
)
def test_a_copy_goes_once_idle_its_timeout_and_never_while_held(
    view: ModelView, place: dict[str, object], at: float | None
) -> None:
    assert unload_at(instance(view, **place), view, TTL, NOW) == at


def test_a_copy_whose_timeout_is_for_ever_or_that_is_gone_has_no_deadline() -> None:
    view = copy(last_used=NOW - 10_000)
    assert unload_at(instance(view), view, Timeout(None, "keep_alive"), NOW) is None
    assert unload_at(instance(view), None, TTL, NOW) is None
    assert unload_at(instance(view), view, Timeout(0.0, "keep_alive"), NOW) == view.since
