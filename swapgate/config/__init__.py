"""What the operator wrote: the settings and their validation, cron schedules, and the catalog of
model names each instance serves. Read once per (re)load; no live state."""
