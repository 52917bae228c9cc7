"""The activity row of a request another model answered (docs/configuration.md, "Fallback
models"): the model it asked for and why, kept in the database, and a version 2 file gains them."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from swapgate.activity import database
from swapgate.activity.log import SCHEMA, ActivityLog
from swapgate.activity.records import WEEK, Activity
from swapgate.control.routing.waiter import Routing
from swapgate.proxy.endpoints import ENDPOINTS
from swapgate.proxy.exchange import Exchange, ModelFallback
from tests.unit.activity.conftest import FakeClock, make_activity


def _exchange(to: str | None) -> Exchange:
    ex = Exchange("POST", ENDPOINTS["/v1/chat/completions"], "req-1", started=100.0)
    ex.model, ex.route = to or "big", "instance/gpu"
    ex.fallback = ModelFallback("big", ("small",), lambda m: True, lambda m: Routing(), 10)
    if to is not None:
        ex.fallback.to, ex.fallback.reason = to, "context"
    return ex


def test_a_row_names_the_model_asked_for_and_why_another_answered() -> None:
    row = Activity(*_exchange("small").row(200, 101.0, (None, None)))
    assert (row.model, row.fallback_from, row.fallback_reason) == ("small", "big", "context")


def test_a_row_with_a_chance_not_taken_names_none() -> None:
    row = Activity(*_exchange(None).row(200, 101.0, (None, None)))
    assert (row.model, row.fallback_from, row.fallback_reason) == ("big", None, None)


async def test_a_version_2_file_gains_the_fallback_columns_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "activity.db"
    version_2 = SCHEMA.replace(",\n    fallback_from TEXT,\n    fallback_reason TEXT", "")
    assert "fallback_from" not in version_2
    with sqlite3.connect(path) as connection:
        connection.executescript(version_2)
        fields = dataclasses.asdict(make_activity(request_id="before"))
        fields.pop("fallback_from")
        fields.pop("fallback_reason")
        names = ", ".join(f'"{name}"' for name in fields)
        marks = ", ".join("?" * len(fields))
        connection.execute(f"INSERT INTO activity ({names}) VALUES ({marks})", [*fields.values()])
        connection.execute("PRAGMA user_version = 2")
    log = ActivityLog(path, max_rows=100, max_age=WEEK, clock=FakeClock())
    log.start()
    log.record(make_activity(request_id="after", fallback_from="big", fallback_reason="backoff"))
    page = await log.query()
    await log.close()
    found = {a.request_id: (a.fallback_from, a.fallback_reason) for _, a in page.rows}
    assert found == {"before": (None, None), "after": ("big", "backoff")}
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == 3
    assert database.SCHEMA_VERSION == 3
