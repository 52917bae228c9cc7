"""``kind: process`` with the real engine (issue 17): swapgate itself starts and stops one
llama-cpp-python server per model, with Gemma-3-270M, on one instance of capacity 1.

Every engine process is found with psutil among the gateway's descendants, so the other
worker's engines (tests run two at a time) never count here.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from testbed.engines import LlamaCppEngine
from tests.e2e.processes import Gateway, gateway, wait_for
from tests.e2e.test_process import ENV, TOKEN, processes, stream_and_kill
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine
MODELS = ("gemma-a", "gemma-b")
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


def engine_command(engine: LlamaCppEngine, alias: str) -> str:
    # env -i: the server reads unprefixed variables (PORT, MODEL, N_CTX, …) as its settings, so
    # it starts from a clean environment; the port comes on the command line.
    keep = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(engine.env().items()))
    return (
        f"/usr/bin/env -i {keep} {engine.python} -m llama_cpp.server --model {engine.gguf}"
        f" --model_alias {alias} --host 127.0.0.1 --port ${{PORT}} --n_ctx 2048 --n_threads 1"
        " --chat_format gemma --interrupt_requests false"
    )


def engine_config(engine: LlamaCppEngine) -> dict[str, Any]:
    return process_node({alias: engine_command(engine, alias) for alias in MODELS})


def engines_under(pid: int) -> list[psutil.Process]:
    """The live llama-cpp-python servers among ``pid``'s descendants."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in descendants:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and "llama_cpp.server" in proc.cmdline():
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


class Census:
    """Counts the gateway's engine processes every 20 ms, to catch two alive at once."""

    def __init__(self, gw: Gateway) -> None:
        self._pid = gw.process.pid
        self.most = 0
        self.pids: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Census:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.02):
            alive = engines_under(self._pid)
            self.most = max(self.most, len(alive))
            self.pids |= {proc.pid for proc in alive}


@pytest.fixture(scope="module")
def node(engine: LlamaCppEngine) -> Iterator[Gateway]:
    with gateway(engine_config(engine), ENV) as gw:
        yield gw


def test_each_swap_stops_one_real_engine_and_starts_the_other(node: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0, timeout=120)
    with client, Census(node) as census:
        first = client.chat.completions.create(model="gemma-a", **CHAT)  # type: ignore[call-overload]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(
                    lambda _: client.chat.completions.create(model="gemma-b", **CHAT),  # type: ignore[call-overload]
                    range(8),
                )
            )
        back = client.chat.completions.create(model="gemma-a", **CHAT)  # type: ignore[call-overload]
    metrics = httpx.get(f"{node.url}/metrics").text
    for answer, model in [
        (first, "gemma-a"),
        *((a, "gemma-b") for a in answers),
        (back, "gemma-a"),
    ]:
        assert answer.model == model
        assert (answer.choices[0].message.content or "").strip()  # real text
    assert census.most == 1, "never two engines at once on capacity 1"
    assert len(census.pids) == 3, "gemma-a, gemma-b, gemma-a again: one process each"
    assert 'swapgate_swaps_total{instance="node",model="gemma-b",result="ok"} 1.0' in metrics
    assert 'swapgate_swaps_total{instance="node",model="gemma-a",result="ok"} 2.0' in metrics


def test_a_real_engine_killed_mid_stream_ends_it_in_band_and_starts_again(node: Gateway) -> None:
    warm = httpx.post(
        f"{node.url}/v1/chat/completions", json={"model": "gemma-a", **CHAT}, timeout=120
    )
    assert warm.status_code == 200, warm.text
    pid, events = stream_and_kill(node, "gemma-a", after=3, max_tokens=400)
    assert json.loads(events[0])["object"] == "chat.completion.chunk"  # the engine's own
    error = json.loads(events[-1])["error"]
    assert error["type"] == "swapgate_error"
    wait_for(lambda: "pid" not in processes(node)["gemma-a"], timeout=15)
    again = httpx.post(
        f"{node.url}/v1/chat/completions", json={"model": "gemma-a", **CHAT}, timeout=120
    )
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"]["content"].strip()
    assert processes(node)["gemma-a"]["pid"] != pid
    metrics = httpx.get(f"{node.url}/metrics").text
    assert 'swapgate_process_exits_total{instance="node",model="gemma-a"} 1.0' in metrics


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_real_engine_outlives_the_gateway(engine: LlamaCppEngine, sig: signal.Signals) -> None:
    with gateway(engine_config(engine), ENV) as gw:
        answer = httpx.post(
            f"{gw.url}/v1/chat/completions", json={"model": "gemma-b", **CHAT}, timeout=120
        )
        assert answer.status_code == 200, answer.text
        engines = engines_under(gw.process.pid)
        port = processes(gw)["gemma-b"]["port"]
        assert len(engines) == 1
        gw.process.send_signal(sig)
        gw.process.wait(timeout=30)
        started = time.monotonic()
        wait_for(lambda: not any(_alive(p) for p in engines), timeout=15)
        gone_after = time.monotonic() - started
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
    assert gone_after < 15


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_real_engine_nobody_waits_for_is_stopped_for_the_model_queued_behind_it(
    engine: LlamaCppEngine,
) -> None:
    """Issue 23 against the real engine: gemma-a's server runs but never passes its ready
    check, its only client leaves, gemma-b queues: the running engine is stopped and gemma-b's
    answers, long before gemma-a's swap_timeout."""
    config = engine_config(engine)
    config["routing"]["swap_timeout"] = "60s"
    commands = config["instances"][0]["commands"]
    commands["gemma-a"] = {"cmd": commands["gemma-a"], "ready": "/never-ready"}
    with gateway(config, ENV) as gw, concurrent.futures.ThreadPoolExecutor(2) as pool:
        url = f"{gw.url}/v1/chat/completions"
        gone = pool.submit(httpx.post, url, json={"model": "gemma-a", **CHAT}, timeout=3.0)
        wait_for(
            lambda: any("gemma-a" in p.cmdline() for p in engines_under(gw.process.pid)), timeout=10
        )
        loading = engines_under(gw.process.pid)
        queued = pool.submit(httpx.post, url, json={"model": "gemma-b", **CHAT}, timeout=60)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and disconnects
            gone.result()
        answer = queued.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"].strip()  # real text
        assert not any(_alive(p) for p in loading)  # gemma-a's engine was stopped
        assert gw.metric("swapgate_swaps_total", model="gemma-a", result="abandoned") == 1
        assert gw.metric("swapgate_swaps_total", model="gemma-b", result="ok") == 1


# A model's engine that dies at load, as a native llama.cpp build did on a CPU with AMX: it
# says where its weights are and what it was given, then SIGSEGV.
CRASHING_ENGINE = """\
import os, signal
print("llama_model_load: loading model from '/srv/private/weights/broken.gguf'", flush=True)
print("load_tensors: HF_TOKEN=hf_not_for_clients", flush=True)
print("llama threadpool init, n_threads = 2", flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_an_engine_that_dies_at_start_takes_none_of_its_neighbours_down(
    engine: LlamaCppEngine, tmp_path: Path
) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text(CRASHING_ENGINE)
    commands: dict[str, object] = {
        "gemma-a": engine_command(engine, "gemma-a"),
        "broken": f"{sys.executable} {crash} --port ${{PORT}}",
    }
    config = process_node(commands)
    config["instances"][0]["capacity"] = 2
    url = "/v1/chat/completions"
    with gateway(config, ENV) as gw:
        assert httpx.post(gw.url + url, json={"model": "gemma-a", **CHAT}, timeout=120).is_success
        pid = processes(gw)["gemma-a"]["pid"]
        codes: list[int] = []
        done = threading.Event()

        def keep_asking() -> None:  # gemma-a's users, while the broken model fails beside it
            while not done.is_set():
                answer = httpx.post(gw.url + url, json={"model": "gemma-a", **CHAT}, timeout=60)
                codes.append(answer.status_code)

        asker = threading.Thread(target=keep_asking)
        asker.start()
        try:
            broken = httpx.post(gw.url + url, json={"model": "broken", **CHAT}, timeout=60)
            started = time.monotonic()
            again = httpx.post(gw.url + url, json={"model": "broken", **CHAT}, timeout=60)
            again_took = time.monotonic() - started
            wait_for(lambda: len(codes) >= 4, timeout=60)
        finally:
            done.set()
            asker.join()
        state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
        instance = state.json()["instances"][0]

    assert broken.status_code == 503, broken.text
    error = broken.json()["error"]
    assert error["code"] == "swap_failed"
    message = error["message"]
    assert "broken exited with SIGSEGV while starting on node" in message
    assert "llama threadpool init, n_threads = 2" in message  # its last lines
    assert "'…/broken.gguf'" in message
    assert "/srv/private" not in message, "no paths beyond the model's file name"
    assert "HF_TOKEN=…" in message
    assert "hf_not_for_clients" not in message, "nothing of the environment"
    assert again.status_code == 503
    assert "backs off loading 'broken'" in again.json()["error"]["message"]
    assert again_took < 2, "a model in backoff fails at once: no second crash to wait for"
    assert len(codes) >= 4
    assert set(codes) == {200}, f"gemma-a answered throughout: {codes}"
    assert instance["processes"]["gemma-a"]["pid"] == pid, "gemma-a was never reloaded"
    assert instance["backoff_until"] is None, "the instance does not back off for one model"
    assert instance["models"]["broken"]["backoff_until"] is not None
    assert "SIGSEGV" in instance["models"]["broken"]["failure"]
