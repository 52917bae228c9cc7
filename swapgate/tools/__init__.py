"""Commands outside the serving path: the CLI, the admin CLI, plan, replay, the demo, and the
real engines the tests and the demo run."""
