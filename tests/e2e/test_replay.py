"""``swapgate replay`` (issue 23): a recorded log replayed reproduces its live swaps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e
# Phases of three concurrent requests, 1 s apart, on two capacity-1 instances: under LRU each
# phase finds its model cold. (0.6 s apart, a busy machine stretched a 0.3 s swap into the next
# phase now and then, and the live run swapped differently from the replay of its log.)
PHASES = ("a", "b", "c") * 4
GAP = 1.0


def test_a_replayed_log_reproduces_the_live_swap_count(tmp_path: Path) -> None:
    log = tmp_path / "swapgate.log"
    with (
        simulator(models=("a", "b", "c"), load_time=0.3) as one,
        simulator(models=("a", "b", "c"), load_time=0.3) as two,
    ):
        config = {
            "server": {"log_level": "info"},
            "routing": {"poll_interval": "1h"},
            "instances": [instance("gpu-0", one), instance("gpu-1", two)],
        }
        with gateway(config, log=log) as gw:
            statuses = _send_phases(gw.url)
        live = one.loads() + two.loads()
    assert statuses == {200}
    assert live >= 10  # enough swaps for 10% to mean something
    config_file = tmp_path / "swapgate.yaml"
    config_file.write_text(yaml.safe_dump(config))
    replayed = subprocess.run(
        [
            sys.executable,
            "-m",
            "swapgate",
            "replay",
            str(log),
            "--config",
            str(config_file),
            "--variant",
            "instances=3",
            # In real time: at 2x a busy machine stretched a 0.15 s replayed swap into the next
            # phase now and then (live 12 swaps, replayed 10), as the live run once did at 0.6 s
            "--speedup",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # The operator's shell may point at the live cluster: the replay must not follow.
        env={
            **os.environ,
            "SWAPGATE_REDIS_URL": "redis://127.0.0.1:1/0",
            "SWAPGATE_SERVER__PORT": "1",
        },
    )
    assert replayed.returncode == 0, replayed.stderr
    rows = {row["name"]: row for row in json.loads(replayed.stdout)}
    assert rows["recorded"]["swaps"] == live  # every swap the log measured
    assert abs(rows["as configured"]["swaps"] - live) <= 0.1 * live, (rows, live)
    assert rows["as configured"]["errors"] == 0
    assert rows["instances=3"]["swaps"] < live  # three models on three instances: fewer swaps


def _send_phases(url: str) -> set[int]:
    statuses: set[int] = set()

    def post(model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        statuses.add(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code)

    threads = []
    for model in PHASES:
        for _ in range(3):
            threads.append(threading.Thread(target=post, args=(model,)))
            threads[-1].start()
        time.sleep(GAP)
    for thread in threads:
        thread.join()
    return statuses
