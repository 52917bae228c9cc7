"""What a request leaves behind once it is over: its metrics, its access-log line, the served
count its engine's decay reads, its row in the activity log and its capture
(docs/operations.md, "Activity"; docs/metrics.md)."""

from __future__ import annotations

import logging
import time

from swapgate.activity.captures import Captures
from swapgate.activity.log import ActivityLog
from swapgate.control.loops.decay import DecayWatch
from swapgate.control.state.registry import Registry
from swapgate.metrics import Metrics
from swapgate.proxy.exchange import Capture, Exchange
from swapgate.proxy.request import Request

log = logging.getLogger("swapgate.access")


class RequestRecords:
    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        decay: DecayWatch,
        activity: ActivityLog | None,
        captures: Captures | None,
    ) -> None:
        """``activity``: where each request's row goes (none: the log is off); ``captures``:
        whose bodies are kept."""
        self._registry = registry
        self._metrics = metrics
        self._decay = decay
        self.activity = activity
        self._captures = captures
        self.access_log = True  # server.access_log, set with each config

    def capture_for(
        self, ex: Exchange, headers: list[tuple[bytes, bytes]], request: Request
    ) -> Capture | None:
        """Where ``ex``'s headers and bodies go as they pass, if captures want them."""
        captures = self._captures
        if captures is None or not captures.wants(ex.model, ex.key):
            return None
        return Capture(captures.max_bytes, headers, request.body)

    def done(self, ex: Exchange, status: int, usage: tuple[int | None, int | None]) -> None:
        """Count, log and keep what ``ex`` left behind, once its answer is over; ``usage``:
        the tokens in and out its engine reported."""
        ended = time.perf_counter()
        elapsed = ended - ex.started
        if ex.sent and ex.route.startswith("instance/"):
            instance = ex.route.removeprefix("instance/")
            since = self._registry.warm_since(instance, ex.model)
            if since is not None:
                self._decay.served(instance, ex.model, since)
        self._metrics.request_done(ex.model, ex.route, status, elapsed, ex.waited)
        self._metrics.endpoint_done(ex.endpoint.label, status)
        if ex.want is not None and ex.want.pool is not None:
            self._metrics.pool_done(ex.model, ex.want.pool.name, status, ex.waited)
        if ex.key is not None:
            self._metrics.key_done(ex.key, status)
        if usage != (None, None):
            self._metrics.tokens_spent(ex.key, ex.model, usage[0] or 0, usage[1] or 0)
        if self.access_log:
            log.info(
                '"%s %s" %d model=%s route=%s wait_ms=%d ms=%.1f id=%s key=%s',
                ex.method,
                ex.endpoint.path,
                status,
                ex.model,
                ex.route,
                round(ex.waited * 1000),
                elapsed * 1000,
                ex.request_id,
                ex.key or "-",
            )
        if self.activity is not None:
            self.activity.record_row(ex.row(status, ended, usage))
        if ex.capture is not None and self._captures is not None:
            self._store(ex, ex.capture, status)

    def _store(self, ex: Exchange, capture: Capture, status: int) -> None:
        assert self._captures is not None
        self._captures.store(
            ex.request_id,
            model=ex.model,
            key=ex.key,
            request_headers=capture.request_headers,
            request_body=capture.request_body,
            status=status,
            response_headers=capture.response_headers,
            response_body=bytes(capture.response_body),
            sizes=(len(capture.request_body), capture.response_size),
        )
