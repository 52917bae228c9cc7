"""``/admin/activity``: each request's row, filtered and paged; requests per key and model over
time; ``/admin/usage``, the tokens each key or model spent over a period; and
``/admin/captures/{request_id}``, a captured request's bodies, for the operator's
token alone (docs/operations.md, "Activity")."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from swapgate.config.settings import parse_duration
from swapgate.errors import BadRequest, PathNotFound
from swapgate.server.runtime import Runtime

# What parse_duration reads (swapgate/config/durations.py); epoch seconds match it too
DURATION = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h)?\s*$"
Since = Annotated[
    str | None,
    Query(description="epoch seconds, or a duration ago: 10m, 2h", pattern=DURATION),
]
# A duration greater than 0
POSITIVE = r"^\s*(0*[1-9]\d*(\.\d+)?|0*\.\d*[1-9]\d*)\s*(ms|s|m|h)?\s*$"
Bucket = Annotated[str, Query(description="a duration: 5m, 1h", pattern=POSITIVE)]
Status = Annotated[int | None, Query(ge=100, le=599, description="an HTTP status, 499 included")]
RowId = Annotated[int | None, Query(ge=0, lt=2**63, description="next_before of a page")]
UsageBy = Literal["key", "model"]  # USAGE_BY's keys


def activity_routes(router: APIRouter, runtime: Runtime) -> None:
    @router.get("/activity")
    async def activity(
        model: str | None = None,
        key: str | None = None,
        instance: str | None = None,
        status: Status = None,
        since: Since = None,
        before: RowId = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        page = await runtime.activity.query(
            model=model,
            key=key,
            instance=instance,
            status=status,
            since=_since(since),
            before=before,
            limit=limit,
        )
        return {
            **page.describe(),
            "recording": runtime.endpoint.records_activity,
            "dropped": runtime.activity.dropped,
            # Where each row's trace_id opens in the trace backend (tracing.ui_url), if set
            "trace_url": runtime.configured.settings.tracing.ui_url,
        }

    @router.get("/activity/counts")
    async def counts(since: Since = "1h", bucket: Bucket = "5m") -> dict[str, Any]:
        width = _duration(bucket, "bucket")
        if width <= 0:
            raise BadRequest("bucket: give a positive duration, such as 5m")
        start = _since(since) or 0.0
        return {"bucket": width, "counts": await runtime.activity.counts(since=start, bucket=width)}

    @router.get("/usage")
    async def usage(since: Since = "24h", by: UsageBy = "key") -> dict[str, Any]:
        start = _since(since) or 0.0
        rows = await runtime.activity.usage(since=start, by=by)
        recording = runtime.endpoint.records_activity
        return {"since": start, "by": by, "rows": rows, "recording": recording}

    @router.get("/captures/{request_id}")  # the operator's token alone (proxy/auth.py)
    async def capture(request_id: str) -> dict[str, Any]:
        found = await runtime.captures.get(request_id)
        if found is None:
            raise PathNotFound(
                f"no capture of request {request_id!r}: captures keep only the models and keys"
                " under capture: in the config, and only the newest capture.keep of them"
            )
        return found


def _since(value: str | None) -> float | None:
    """Epoch seconds as given, or a duration with its unit counted back from now."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        return time.time() - _duration(value, "since")


def _duration(value: str, name: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = None
    if not isinstance(seconds, float):
        raise BadRequest(f"{name}: {value!r} is neither epoch seconds nor a duration like 10m")
    return seconds
