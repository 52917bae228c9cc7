"""How a swap ended, learned by everyone who must: the swap log's entry, the load's progress
ended, the metrics and the measured swap times, then the registry and the backoff (a failure
backs off the model there, the whole instance when another of its models failed lately, and
the model's failures fleet-wide may make it failing: control/faults/failing.py)."""

from __future__ import annotations

import logging

from swapgate.control.state.registry import Registry
from swapgate.control.swaps.load_progress import LoadProgress
from swapgate.control.swaps.swaplog import SwapLog
from swapgate.control.swaps.times import Kind, SwapTimes
from swapgate.errors import shown_to_clients
from swapgate.metrics import Metrics
from swapgate.policy.backoff import Backoff, Blame

log = logging.getLogger("swapgate.swaps")


class SwapOutcomes:
    def __init__(
        self,
        registry: Registry,
        backoff: Backoff,
        swaps: SwapLog,
        progress: LoadProgress,
        times: SwapTimes,
        metrics: Metrics,
    ) -> None:
        self._registry = registry
        self.backoff = backoff
        self._log = swaps
        self._progress = progress
        self._times = times
        self._metrics = metrics

    def settle(
        self, instance: str, model: str, ok: bool, error: str = "", blame: Blame = "model"
    ) -> bool:
        """The registry and the backoff learn how a swap (or restart) ended: a failure backs
        off the model there, and the whole instance when another of its models failed lately;
        the model's failures fleet-wide may make it failing (control/faults/failing.py)."""
        marks = self._registry.swap_marks
        if ok:
            self.backoff.succeeded(instance, model)
            self._registry.failing.succeeded(model)
            marks.end_swap(instance, model, ok=True)
            return ok
        verdict = self.backoff.failed(instance, model)
        if verdict.instance:
            line = "%s backs off for %.0fs: two or more of its models failed to load within %.0fs"
            log.warning(line, instance, verdict.instance, self.backoff.window)
        failure = shown_to_clients(error)
        self._registry.failing.failed(model, instance, error, blame)
        marks.end_swap(
            instance, model, False, verdict.model, whole=verdict.instance, failure=failure
        )
        return ok

    def record(
        self,
        instance: str,
        model: str,
        how: tuple[str, Kind, str],
        elapsed: float,
        warm: bool,
        error: str = "",
        blame: Blame = "model",
    ) -> bool:
        """A swap ended (``how``: its result, kind and weights' tier): its log entry, its
        metrics and its time, then ``settle``."""
        result, kind, tier = how
        record = self._log.running_on(instance)
        if record is not None:
            self._log.end(record, result, elapsed, error, tier, self._times.sizes.get(model))
        self._progress.ended(instance, model)
        if result == "abandoned" and not warm:  # stopped, not failed: no backoff
            self._registry.swap_marks.end_swap(instance, model, ok=False)
        else:
            self.settle(instance, model, warm, error, blame)
        if result == "abandoned" and warm:
            self._registry.swap_marks.mark_abandoned(instance, model)
        self._metrics.swap_duration.labels(instance, model, result, tier).observe(elapsed)
        self._metrics.swaps.labels(instance, model, result).inc()
        if kind == "wake":
            self._metrics.wake_duration.labels(instance, model, result).observe(elapsed)
        if warm:
            self._times.record(instance, model, elapsed, kind, tier)
            log.info("swap done (%s): %s on %s in %.2fs", kind, model, instance, elapsed)
        return warm
