"""Scheduled preloads (docs/operations.md): one APScheduler job per ``preloads`` entry, on the app's
loop.

A job with ``auto: true`` has no cron: every ``AUTO_TICK`` it asks the learned day
(swapgate/control/loops/forecast.py) when the model's next peak begins, and within ``lead`` of it —
twice the model's expected swap, at least ``MIN_LEAD`` — preloads it once per peak if the room is
free or cheap: every model it would evict is usually less in demand in that slot than this one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from swapgate.config.cron import cron_trigger
from swapgate.config.settings import PreloadConfig
from swapgate.control.loops.forecast import SLOT, WEEKDAYS, WEEKENDS, DayDemand
from swapgate.control.loops.preload import Preloader, PreloadResult
from swapgate.metrics import Metrics

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from swapgate.tracing.spans import Attribute, Tracing

log = logging.getLogger("swapgate.scheduler")
# A run that could not start on time (the gateway was busy or restarting) still runs this late.
MISFIRE_GRACE = 300
AUTO_TICK = 20.0  # seconds between an auto job's looks at the next peak
MIN_LEAD = 60.0  # an auto preload starts at least this long before the peak
KINDS = {"weekdays": WEEKDAYS, "weekends": WEEKENDS}
SAVE_EVERY = 300.0  # seconds between writes of the learned day, while an auto job exists


@dataclass
class JobRecord:
    config: PreloadConfig
    last_run: datetime | None = None
    last_result: PreloadResult | None = None
    warmed_for: float | None = None  # auto: the peak (wall time) it last preloaded for
    skipped: str | None = None  # auto: why the last peak was not preloaded for


class PreloadScheduler:
    def __init__(
        self,
        preloader: Callable[[], Preloader],
        metrics: Metrics,
        leads: Callable[[], Awaitable[bool]] | None = None,
        demand: DayDemand | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``tracing``: each run a span, the swaps it starts its children (swapgate/tracing/)."""
        self._tracing = tracing
        # A getter: the scheduler lives across reloads, the preloader (its policy, its
        # swap_timeout) is the current config's.
        self._preloader = preloader
        # Among replicas, whether this one runs the schedule now (swapgate/cluster/store.py)
        self._leads = leads
        self._metrics = metrics
        self._demand = demand or DayDemand(None)
        self._scheduler = AsyncIOScheduler()
        self._jobs: dict[str, JobRecord] = {}

    def start(self, jobs: list[PreloadConfig]) -> None:
        self._scheduler.start()
        self.replace(jobs)

    def replace(self, jobs: list[PreloadConfig]) -> None:
        """Schedule exactly ``jobs``; the history of jobs that keep their name stays."""
        self._scheduler.remove_all_jobs()
        previous, self._jobs = self._jobs, {}
        for job in jobs:
            record = previous.get(job.name) or JobRecord(job)
            record.config = job
            self._jobs[job.name] = record
            if job.cron is None:  # auto: true (the config allows no other job without cron)
                # the first look at once; None would add the job paused (APScheduler 3)
                first = {"next_run_time": datetime.now().astimezone()}
                work, trigger = self._auto, IntervalTrigger(seconds=AUTO_TICK)
            else:
                first, work, trigger = {}, self._scheduled, cron_trigger(job.cron, job.timezone)
            self._scheduler.add_job(
                work,
                trigger,
                args=[job.name],
                id=job.name,
                coalesce=True,
                max_instances=1,
                misfire_grace_time=MISFIRE_GRACE,
                **first,
            )
        if any(job.auto for job in jobs):
            self._scheduler.add_job(
                self._demand.save, IntervalTrigger(seconds=SAVE_EVERY), id="save demand"
            )

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    def has(self, name: str) -> bool:
        return name in self._jobs

    async def _scheduled(self, name: str) -> None:
        """A trigger: the run happens here unless another replica holds the schedule."""
        if self._leads is not None and not await self._leads():
            log.debug("preload job %s: another replica runs the schedule", name)
            return
        await self.run(name)

    async def _auto(self, name: str) -> None:
        """An auto job's look: preload for the model's next peak if it begins within lead."""
        if self._leads is not None and not await self._leads():
            return
        record = self._jobs[name]
        peak = self._demand.next_peak(record.config.model, time.time())
        if peak is None or peak == record.warmed_for:
            return
        model, lead = record.config.model, self._lead(record.config.model)
        if peak - time.time() > lead:
            return
        record.warmed_for = peak
        victims = self._preloader().victims(model)
        if victims is None:
            record.skipped = "warm already, or no room it may make"
            return
        busier = [
            v for v in victims if self._demand.usual(v, peak) >= self._demand.usual(model, peak)
        ]
        if busier:
            record.skipped = f"no cheap room: {', '.join(busier)} usually as busy then"
            log.info("auto preload %s: skipped, %s", name, record.skipped)
            return
        record.skipped = None
        log.info(
            "auto preload %s: %s peaks at %s",
            name,
            model,
            datetime.fromtimestamp(peak).astimezone().isoformat(),
        )
        await self.run(name)

    def _lead(self, model: str) -> float:
        return max(MIN_LEAD, 2 * self._preloader().expected_swap(model))

    def save(self) -> None:
        """Write the learned day (at shutdown, besides every ``SAVE_EVERY``)."""
        if any(r.config.auto for r in self._jobs.values()):
            self._demand.save()

    async def run(self, name: str) -> PreloadResult:
        record = self._jobs[name]
        job = record.config
        log.info("preload job %s: %s on %d instance(s)", name, job.model, job.instances)
        record.last_run = datetime.now().astimezone()
        preloader = self._preloader()
        if self._tracing is None:
            result = await preloader.preload(job.model, job.instances, pin_for=job.pin_for)
        else:
            attributes: dict[str, Attribute] = {"swapgate.model": job.model, "swapgate.job": name}
            span = self._tracing.span(f"preload {name}", attributes)
            with self._tracing.current(span):  # its swaps are its children
                result = await preloader.preload(job.model, job.instances, pin_for=job.pin_for)
            self._tracing.finish(span, {"swapgate.result": "ok" if result.ok else "failed"})
        record.last_result = result
        self._metrics.preload_runs.labels(name, "ok" if result.ok else "failed").inc()
        if not result.ok:
            log.warning("preload job %s failed: %s", name, result.error)
        return result

    def describe(self) -> list[dict[str, Any]]:
        return [self._describe(name, record) for name, record in self._jobs.items()]

    def upcoming(self) -> list[tuple[float, str]]:
        """Each job's next run (a learned one's: when it will warm its model) as (wall-clock
        time, model): what the host cache reads in ahead (docs/host-cache.md)."""
        runs = []
        for job in self.describe():
            if job["next_run"]:
                runs.append((datetime.fromisoformat(job["next_run"]).timestamp(), job["model"]))
        return runs

    def _describe(self, name: str, record: JobRecord) -> dict[str, Any]:
        job = self._scheduler.get_job(name)
        next_run = job.next_run_time if job is not None else None
        result = record.last_result
        described = {
            "name": name,
            "model": record.config.model,
            "auto": record.config.auto,
            "cron": record.config.cron,
            "timezone": record.config.timezone,
            "instances": record.config.instances,
            "pin_for": record.config.pin_for,
            "next_run": next_run.isoformat() if next_run else None,
            "last_run": record.last_run.isoformat() if record.last_run else None,
            "last_result": describe_result(result) if result else None,
        }
        if record.config.auto:
            described |= self._prediction(record)
        return described

    def _prediction(self, record: JobRecord) -> dict[str, Any]:
        """What an auto job learned: its model's peaks (HH:MM in the job's zone) and when it
        will warm it next; ``next_run`` is that moment."""
        model, zone = record.config.model, ZoneInfo(record.config.timezone)
        peak = self._demand.next_peak(model, time.time())
        if peak is not None and peak == record.warmed_for:  # warmed for: show the one after
            peak = self._demand.next_peak(model, peak + SLOT)
        warm_at = peak - self._lead(model) if peak is not None else None
        return {
            "next_run": _iso(warm_at, zone),
            "prediction": {
                "learned_days": {name: self._demand.days(model, of) for name, of in KINDS.items()},
                "peaks": {
                    name: [
                        datetime.fromtimestamp(slot * SLOT, zone).strftime("%H:%M")
                        for slot in self._demand.peak_starts(model, of)
                    ]
                    for name, of in KINDS.items()
                },
                "next_peak": _iso(peak, zone),
                "usual_requests": round(self._demand.usual(model, peak), 1) if peak else None,
                "skipped": record.skipped,
            },
        }


def _iso(at: float | None, zone: ZoneInfo) -> str | None:
    return datetime.fromtimestamp(at, zone).isoformat() if at is not None else None


def describe_result(result: PreloadResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "model": result.model,
        "instances": list(result.instances),
        "seconds": round(result.seconds, 3),
        "error": result.error,
    }
