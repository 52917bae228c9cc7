"""The activity log's row."""

from __future__ import annotations

from tests.unit.activity.conftest import make_activity


def test_an_activity_describes_itself_for_json() -> None:
    described = make_activity(request_id="r1", placement="swap", swap_id=7).describe()

    assert described["request_id"] == "r1"
    assert (described["placement"], described["swap_id"]) == ("swap", 7)
