"""Agents on one GPU, for real (docs/configuration.md, "Residency that knows who is waiting"):
three agents in lockstep, each looping over a planner turn and a coder turn, through swapgate in
front of the real llama-swap (one model at a time, loads of ``LOAD`` seconds). Once the last
planner request of a round has ended, every agent waits for the coder: the swap to it starts at
once, not after the planner's residency (a swap's length)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from testbed.engines import LlamaSwapEngine
from tests.e2e.processes import free_port, gateway, start, stop, wait_until_serving

pytestmark = pytest.mark.engine
AGENTS, ROUNDS = 3, 4
LOAD = 1.0
TOKEN = "agents-admin"


class SwapWatch:
    """When swapgate started each swap to the coder, as ``/admin/state`` shows it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SwapWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        headers = {"authorization": f"Bearer {TOKEN}"}
        was = None
        with httpx.Client(headers=headers, timeout=5) as client:
            while not self._stop.wait(0.03):
                now = time.monotonic()
                swapping = client.get(f"{self.url}/admin/state").json()["instances"][0]["swapping"]
                if swapping == "coder" and was != "coder":
                    self.started.append(now)
                was = swapping


def test_lockstep_agents_swap_to_the_coder_as_soon_as_the_last_planner_turn_ends(
    swap_engine: LlamaSwapEngine, tmp_path: Path
) -> None:
    config_path = swap_engine.write_config(
        tmp_path / "llama-swap.yaml", {"planner": 2048, "coder": 2048}, load_time=LOAD
    )
    port = free_port()
    process = start(swap_engine.command(config_path, port), log=tmp_path / "llama-swap.log")
    planner_ends: list[list[float]] = [[] for _ in range(ROUNDS)]

    def agent(url: str, number: int) -> None:
        for round_ in range(ROUNDS):
            for model in ("planner", "coder"):
                body = {
                    "model": model,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"Agent {number}: go on."}],
                }
                httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).raise_for_status()
                if model == "planner":
                    planner_ends[round_].append(time.monotonic())

    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", process)
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "1s"},
            "instances": [
                {
                    "name": "gpu",
                    "kind": "llama-swap",
                    "capacity": 1,
                    "url": f"http://127.0.0.1:{port}",
                }
            ],
        }
        with gateway(config, {"TEST_ADMIN_TOKEN": TOKEN}) as gw, SwapWatch(gw.url) as watch:
            agents = [threading.Thread(target=agent, args=(gw.url, n)) for n in range(AGENTS)]
            for thread in agents:
                thread.start()
            for thread in agents:
                thread.join()
            swaps = gw.metric("swapgate_swaps_total", model="coder", result="ok")
    finally:
        stop(process, timeout=20)
    gaps = []
    for ends in planner_ends[1:]:  # the first round teaches swapgate how many agents there are
        last = max(ends)
        after = [s for s in watch.started if s >= last - 0.05]
        gaps.append(after[0] - last if after else float("inf"))
    print(f"\nfrom the last planner turn's end to the swap to the coder: {gaps} s")
    assert swaps == ROUNDS, "one swap to the coder per round"
    assert max(gaps) < 0.5, f"the swap starts at once, not after a residency: {gaps}"
