"""When part of a real llama-swap fleet breaks (docs/operations.md, "When part of the fleet
breaks"): two llama-swap instances (v250) running llama-server, one model whose command exits at
once (as a truncated GGUF's does), then one llama-swap killed, then one stopped (SIGSTOP: it
accepts connections and never answers, as an engine wedged in a GPU call)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from testbed.engines import LlamaSwapEngine
from tests.e2e.processes import Gateway, free_port, gateway, start, stop, wait_until_serving

pytestmark = pytest.mark.engine
TOKEN = "llama-swap-faults-admin"
MODELS = {"gemma-a": 1024, "broken": 1024}
# Its engine exits as it starts, saying why (llama-server's words for a file cut short), which
# llama-swap logs
SAYS = "llama_model_load: error loading model: tensor data is not within the file bounds"
# (llama-swap wants its port named in the command: the shell is handed it and ignores it)
BROKEN: dict[str, object] = {"cmd": f"sh -c 'echo \"{SAYS}\" >&2; exit 1' broken ${{PORT}}"}
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class Fleet:
    processes: list[Any]
    urls: list[str]
    gw: Gateway


@pytest.fixture
def fleet(swap_engine: LlamaSwapEngine, tmp_path: Path) -> Iterator[Fleet]:
    with ExitStack() as stack:
        processes, urls = [], []
        for n in range(2):
            port = free_port()
            config = swap_engine.write_config(
                tmp_path / f"llama-swap-{n}.yaml", MODELS, {}, {"broken": BROKEN}
            )
            process = start(swap_engine.command(config, port), log=tmp_path / f"ls-{n}.log")
            stack.callback(_stopped, process)
            url = f"http://127.0.0.1:{port}"
            wait_until_serving(f"{url}/health", process)
            processes.append(process)
            urls.append(url)
        config_ = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "2s", "min_residency": 0, "swap_timeout": "120s"},
            "keepalive": {"early_headers_after": "30s"},
            "instances": [
                {"name": f"ls-{n}", "kind": "llama-swap", "url": url, "models": list(MODELS)}
                for n, url in enumerate(urls)
            ],
        }
        env = {"TEST_ADMIN_TOKEN": TOKEN}
        gw = stack.enter_context(gateway(config_, env, log=tmp_path / "gateway.log"))
        yield Fleet(processes, urls, gw)


def _stopped(process: Any) -> None:
    with contextlib.suppress(ProcessLookupError):  # a stopped one would not hear its SIGTERM
        os.kill(process.pid, signal.SIGCONT)
    stop(process, timeout=20)


def chat(gw: Gateway, model: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    body = {"model": model, "messages": HELLO, "max_tokens": 4}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=180)
    return answer, time.monotonic() - started


def warm_on(gw: Gateway, model: str) -> list[str]:
    with gw.admin(TOKEN) as admin:
        state = admin.get("/admin/state").raise_for_status().json()
    return list(state["models"][model]["warm_on"])


def test_a_broken_model_a_killed_and_a_stopped_llama_swap(fleet: Fleet) -> None:
    gw = fleet.gw
    first, seconds = chat(gw, "broken")
    assert first.status_code == 503, first.text
    error = first.json()["error"]
    assert error["code"] == "model_failing"
    # What llama-swap v250 says of it (the engine's own lines stay in llama-swap's log), on
    # each instance it was tried on
    assert error["message"].count("upstream command exited prematurely") == 2, error
    assert int(first.headers["retry-after"]) >= 1
    failed = gw.metric("swapgate_swaps_total", model="broken", result="failed")
    assert failed == 2, "one attempt on each instance, each started once"
    assert seconds < 30
    again, quick = chat(gw, "broken")
    assert again.json()["error"]["code"] == "model_failing"
    assert quick < 1.0
    assert gw.metric("swapgate_swaps_total", model="broken", result="failed") == failed
    assert gw.metric("swapgate_model_failing", model="broken") == 1.0

    # gemma-a warm on one llama-swap, which is then killed: served by the other, no 502
    served, _ = chat(gw, "gemma-a")
    assert served.status_code == 200, served.text
    (holder,) = warm_on(gw, "gemma-a")
    dead = int(holder.removeprefix("ls-"))
    host = psutil.Process(fleet.processes[dead].pid)
    for process in [*host.children(recursive=True), host]:  # the host goes, engines and all
        process.kill()
    fleet.processes[dead].wait()
    moved, _ = chat(gw, "gemma-a")
    assert moved.status_code == 200, moved.text
    assert moved.headers["x-swapgate-route"] == f"instance/ls-{1 - dead}"

    # The other stops answering while it holds gemma-a: the request ends once it is declared
    # down, naming it, not at 120 s
    alive = fleet.processes[1 - dead]
    os.kill(alive.pid, signal.SIGSTOP)
    try:
        hung, waited = chat(gw, "gemma-a")
    finally:
        os.kill(alive.pid, signal.SIGCONT)
    assert hung.status_code == 504, hung.text
    assert hung.json()["error"]["code"] == "instance_down"
    assert f"ls-{1 - dead}" in hung.json()["error"]["message"]
    assert waited < 30, f"held {waited:.1f}s"
