"""``make run`` (``swapgate demo``) turns its admin API on with a token of its own, prints it,
and ``swapgate status`` in another terminal works with no flag: a newcomer's first command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import STATE_DIR, free_port, spawn, stop, wait_until_serving

pytestmark = pytest.mark.e2e
DEMO = Path(__file__).parents[2] / "config" / "demo.yaml"


def test_the_demo_admin_api_is_on_and_the_cli_finds_its_token(tmp_path: Path) -> None:
    config = yaml.safe_load(DEMO.read_text())
    config["server"] = {**config.get("server", {}), "port": free_port(), "log_level": "warning"}
    for instance in config["instances"]:  # the demo's own ports may be taken here
        instance["url"] = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "SWAPGATE_ADMIN_TOKEN"}
    os.environ.pop("SWAPGATE_ADMIN_TOKEN", None)
    log = tmp_path / "demo.log"
    demo = spawn(["demo", "--config", str(path), "--load-time", "0.2"], log=log)
    url = f"http://127.0.0.1:{config['server']['port']}"
    cli_env = {**env, "SWAPGATE_STATE_DIR": STATE_DIR}
    try:
        wait_until_serving(f"{url}/readyz", demo, timeout=60)
        status = subprocess.run(
            [sys.executable, "-m", "swapgate", "status", "--url", url],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        stop(demo)
    assert status.returncode == 0, status.stderr
    assert config["instances"][0]["name"] in status.stdout
    printed = log.read_text()
    assert "swapgate status" in printed
    assert "authorization: Bearer " in printed  # the token, with a curl line that uses it
    stale = subprocess.run(
        [sys.executable, "-m", "swapgate", "status", "--url", url],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stale.returncode == 1  # the demo is gone: its token is not offered to anyone else
