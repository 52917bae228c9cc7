"""Scheduled preloads (SPEC §8): one APScheduler job per ``preloads`` entry, on the app's loop."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from swapgate.config import PreloadConfig
from swapgate.cron import cron_trigger
from swapgate.metrics import Metrics
from swapgate.preload import Preloader, PreloadResult

log = logging.getLogger("swapgate.scheduler")
# A run that could not start on time (the gateway was busy or restarting) still runs this late.
MISFIRE_GRACE = 300


@dataclass
class JobRecord:
    config: PreloadConfig
    last_run: datetime | None = None
    last_result: PreloadResult | None = None


class PreloadScheduler:
    def __init__(
        self,
        preloader: Callable[[], Preloader],
        metrics: Metrics,
        leads: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        # A getter: the scheduler lives across reloads, the preloader (its policy, its
        # swap_timeout) is the current config's.
        self._preloader = preloader
        # Among replicas, whether this one runs the schedule now (swapgate/cluster.py)
        self._leads = leads
        self._metrics = metrics
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
            self._scheduler.add_job(
                self._scheduled,
                cron_trigger(job.cron, job.timezone),
                args=[job.name],
                id=job.name,
                coalesce=True,
                max_instances=1,
                misfire_grace_time=MISFIRE_GRACE,
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

    async def run(self, name: str) -> PreloadResult:
        record = self._jobs[name]
        job = record.config
        log.info("preload job %s: %s on %d instance(s)", name, job.model, job.instances)
        record.last_run = datetime.now().astimezone()
        preloader = self._preloader()
        result = await preloader.preload(job.model, job.instances, pin_for=job.pin_for)
        record.last_result = result
        self._metrics.preload_runs.labels(name, "ok" if result.ok else "failed").inc()
        if not result.ok:
            log.warning("preload job %s failed: %s", name, result.error)
        return result

    def describe(self) -> list[dict[str, Any]]:
        return [self._describe(name, record) for name, record in self._jobs.items()]

    def _describe(self, name: str, record: JobRecord) -> dict[str, Any]:
        job = self._scheduler.get_job(name)
        next_run = job.next_run_time if job is not None else None
        result = record.last_result
        return {
            "name": name,
            "model": record.config.model,
            "cron": record.config.cron,
            "timezone": record.config.timezone,
            "instances": record.config.instances,
            "pin_for": record.config.pin_for,
            "next_run": next_run.isoformat() if next_run else None,
            "last_run": record.last_run.isoformat() if record.last_run else None,
            "last_result": describe_result(result) if result else None,
        }


def describe_result(result: PreloadResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "model": result.model,
        "instances": list(result.instances),
        "seconds": round(result.seconds, 3),
        "error": result.error,
    }
