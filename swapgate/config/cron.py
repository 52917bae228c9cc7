"""Preload schedules (docs/operations.md): crontab's five fields, or six with seconds first.

Its own module so that validating a config (swapgate/config/settings.py) and scheduling its jobs
(swapgate/control/loops/scheduler.py) read a schedule the same way, without the config importing the
scheduler.
"""

from __future__ import annotations

from apscheduler.triggers.cron import CronTrigger


def cron_trigger(cron: str, timezone: str) -> CronTrigger:
    """Five fields as in crontab; six fields put seconds first (``*/10 * * * * *``)."""
    fields = cron.split()
    if len(fields) == 6:
        second, minute, hour, day, month, weekday = fields
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=weekday,
            timezone=timezone,
        )
    return CronTrigger.from_crontab(cron, timezone=timezone)
