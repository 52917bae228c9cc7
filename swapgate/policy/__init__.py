"""Decisions as pure functions of a snapshot and the config: placement, the timing rules,
fallback, pools and backoff. Nothing here changes state or waits."""
