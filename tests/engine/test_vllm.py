"""The real vLLM (its CPU build, serving a tiny Llama made on the machine;
testbed/engines.py) behind ``kind: vllm-sleep`` and ``kind: process``.

What the real server does that matters here (docs/compatibility.md): it starts awake; asleep, it
holds a chat request silently until a wake rather than refusing it, while ``/health`` and
``/v1/models`` still answer; a sleep or a wake twice is no error. Every server is a real
``vllm serve``, started by the test or by swapgate, and stopped by whoever started it: its
worker inside its engine core (``VllmEngine.serve``: a start on 17 s of CPU, not 26), so
three processes (API server, engine core, multiprocessing's resource tracker), which swapgate
must stop all of where it started them.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ollama
import psutil
import pytest

from testbed.engines import VllmEngine, ensure_vllm
from tests.e2e.processes import (
    Gateway,
    free_port,
    gateway,
    start,
    stop,
    wait_for,
    wait_until_serving,
)
from tests.e2e.wire import post
from tests.engine.recorder import Event, Recorder, recording

pytestmark = pytest.mark.e2e
TOKEN = "vllm-admin"
ENV = {"TEST_ADMIN_TOKEN": TOKEN}
STARTUP = 240.0  # ~30 s alone, more than twice that with two starting on a busy machine
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello there"}]


@dataclass
class VllmServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def sleeping(self) -> bool:
        answer = httpx.get(f"{self.url}/is_sleeping", timeout=10).raise_for_status()
        return bool(answer.json()["is_sleeping"])


@pytest.fixture(scope="module")
def engine() -> VllmEngine:
    return ensure_vllm()


@pytest.fixture
def scratch(engine: VllmEngine) -> Iterator[Path]:
    """vLLM's TMPDIR for the test, removed after it (``VllmEngine.scratch``)."""
    with engine.scratch() as folder:
        yield folder


@contextmanager
def vllm_servers(
    engine: VllmEngine, root: Path, names: tuple[str, ...]
) -> Iterator[dict[str, VllmServer]]:
    """A ``vllm serve`` per name, started together (each alone takes ~16 s), its worker in its
    engine core: what sleeps and wakes is the same."""
    servers: dict[str, VllmServer] = {}
    with engine.scratch() as scratch:
        try:
            for name in names:
                port = free_port()
                log = root / f"vllm-{name}.log"
                command = engine.serve(name, port)
                process = start(command, engine.env(scratch), log=log)
                servers[name] = VllmServer(f"http://127.0.0.1:{port}", process, log)
            for server in servers.values():
                _until_healthy(server)
            yield servers
        finally:
            for server in servers.values():
                stop(server.process, timeout=20)


def _until_healthy(server: VllmServer) -> None:
    try:
        wait_until_serving(f"{server.url}/health", server.process, timeout=STARTUP)
    except (RuntimeError, TimeoutError) as exc:  # with what vLLM said
        raise RuntimeError(f"{exc}: {server.log.read_text()[-3000:]}") from exc


def chat(gw: Gateway, model: str, max_tokens: int = 4) -> httpx.Response:
    body = {"model": model, "messages": HELLO, "max_tokens": max_tokens}
    return httpx.post(f"{gw.url}{CHAT}", json=body, timeout=120)


def admin_state(gw: Gateway) -> dict[str, Any]:
    with gw.admin(TOKEN) as admin:
        answer: dict[str, Any] = admin.get("/admin/state").raise_for_status().json()
    return answer


def state(gw: Gateway) -> dict[str, Any]:
    instance: dict[str, Any] = admin_state(gw)["instances"][0]
    return instance


def model_states(gw: Gateway) -> tuple[str, str]:
    """What swapgate says of a and b."""
    models = state(gw)["models"]
    return models["a"]["state"], models["b"]["state"]


def awake(servers: dict[str, VllmServer]) -> set[str]:
    """The servers that say they are awake, asked directly."""
    return {name for name, server in servers.items() if not server.sleeping()}


def sleeps(recorder: Recorder) -> list[Event]:
    """The sleeps ``recorder``'s server answered."""
    return [e for e in recorder.seen() if e.path.startswith("/sleep") and e.what == "answered"]


def sent_asleep(recorder: Recorder) -> list[Event]:
    """The chat requests that reached the server while it slept: after a sleep answered and
    before a wake answered that it is awake (a partial wake, ``?tags=weights``, answers that it
    still sleeps; a real vLLM would hold them, silent)."""
    asleep, wrong = False, []
    for event in recorder.seen():
        if event.what == "answered" and event.status == 200 and event.method == "POST":
            if event.path.startswith("/sleep"):
                asleep = True
            elif event.path.startswith("/wake_up"):
                asleep = json.loads(event.body)["status"] != "awake"
        elif event.what == "arrived" and event.path == CHAT and asleep:
            wrong.append(event)
    return wrong


def both_awake(recorders: dict[str, Recorder]) -> list[tuple[float, set[str]]]:
    """The moments two servers could have been awake at once, from what swapgate asked: a wake
    counts from when it was asked, a sleep from when it answered. Both start awake, so the
    count starts at the first sleep."""
    events = sorted((e.at, name, e) for name, r in recorders.items() for e in r.seen())
    up, started, overlaps = set(recorders), False, []
    for at, name, event in events:
        if event.method != "POST":
            continue
        if event.path.startswith("/wake_up") and event.what == "arrived":
            up.add(name)
        elif event.path.startswith("/sleep") and event.what == "answered" and event.status == 200:
            up.discard(name)
            started = True
        if started and len(up) > 1:
            overlaps.append((at, set(up)))
    return overlaps


def test_two_real_servers_on_one_place_take_turns_asleep_and_none_is_sent_a_request_asleep(
    engine: VllmEngine, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        servers = stack.enter_context(vllm_servers(engine, tmp_path, ("a", "b")))
        slow = {"/wake_up": 0.5}  # as on a GPU: any request sent before it answers is seen
        recorders = {n: stack.enter_context(recording(s.url, slow)) for n, s in servers.items()}
        config: dict[str, Any] = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "1s", "min_residency": 0, "swap_timeout": "30s"},
            "instances": [
                {
                    "name": "gpu",
                    "kind": "vllm-sleep",
                    "capacity": 1,
                    "servers": {n: r.url for n, r in recorders.items()},
                }
            ],
        }
        gw = stack.enter_context(gateway(config, ENV))

        # Both start awake, as vllm serve does: swapgate puts one to sleep at once.
        wait_for(lambda: len(awake(servers)) == 1, timeout=15)
        models = state(gw)["models"]
        assert sorted(m["state"] for m in models.values()) == ["asleep", "warm"], models

        for model in ("a", "b", "a", "b", "b", "a"):
            answer = chat(gw, model)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["model"] == model
            assert body["usage"]["completion_tokens"] == 4, "vLLM generated what was asked"
            assert body["choices"][0]["message"]["content"], "real tokens, decoded"
            assert awake(servers) == {model}, f"after {model}: only {model} is awake"
        # An Ollama client (its own Python library) wakes b: the wait is its load_duration
        with ollama.Client(host=gw.url, timeout=60) as client:
            told = {"num_predict": 4}
            parts = list(client.chat(model="b", messages=HELLO, stream=True, options=told))
        woken, woken_text = parts[-1], "".join(p.message.content or "" for p in parts)
        stream = post(
            gw.url, CHAT, {"model": "b", "messages": HELLO, "max_tokens": 4, "stream": True}
        )
        assert stream.status == 200
        assert "data: [DONE]" in stream.lines(), stream.body[-300:]

        # A wake by hand (an operator, a script): back to sleep with the next poll, the one
        # less wanted (a, used before b).
        assert servers["a"].sleeping()
        slept = len(sleeps(recorders["a"]))
        httpx.post(f"{servers['a'].url}/wake_up", timeout=10).raise_for_status()
        # Not asserted awake here: on a loaded machine the next poll may already have put it
        # back to sleep. swapgate's own sleep of a, after the wake, shows it noticed.
        wait_for(lambda: len(sleeps(recorders["a"])) > slept, timeout=10)
        wait_for(lambda: awake(servers) == {"b"}, timeout=10)
        # swapgate marks a asleep once it has read the sleep's answer, a moment after the
        # recorder passed it on.
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: model_states(gw) == ("asleep", "warm"), timeout=5)
        view = state(gw)["models"]
        assert (view["a"]["state"], view["b"]["state"]) == ("asleep", "warm"), view
        eta = admin_state(gw)["models"]["a"]["eta_seconds"]["gpu"]
        assert 0 < eta < 5, "the ETA of a wake, measured"
        metrics = gw.metrics()

        # Level 2 drops the weights: each wake reads them again (reload_weights) before the
        # rest wakes, and only then does a request go there.
        config["instances"][0]["sleep_level"] = 2
        reload(gw, config)
        for model in ("a", "b"):
            answer = chat(gw, model)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
            assert awake(servers) == {model}
        reloads = [
            e
            for r in recorders.values()
            for e in r.seen()
            if e.path == "/collective_rpc" and e.what == "answered"
        ]
        assert [e.status for e in reloads] == [200, 200], "one reload of the weights per wake"

        # a's server dies while asleep: only a fails, at once; b keeps answering and is never
        # put to sleep for it. (A server restarted comes back awake, as at the start here, and
        # is taken back: tests/e2e/test_vllm_sleep.py, without a third start of vLLM.)
        stop(servers["a"].process, timeout=20)
        b_slept = len(sleeps(recorders["b"]))
        # Whether a poll saw it yet or not (then the swap asks a's server before b sleeps)
        failed = chat(gw, "a")
        wait_for(lambda: state(gw)["models"].get("a", {}).get("unreachable"), timeout=10)
        started = time.monotonic()
        known = chat(gw, "a")  # once a poll saw it: at once, naming the server
        known_took = time.monotonic() - started
        b_codes = [chat(gw, "b").status_code for _ in range(4)]
        after = state(gw)
        failures = gw.metric("swapgate_swaps_total", instance="gpu", model="a", result="failed")
        b_still_awake = awake({"b": servers["b"]}) == {"b"}
        b_slept_since = len(sleeps(recorders["b"])) - b_slept

    for name, recorder in recorders.items():
        assert sent_asleep(recorder) == [], f"{name} was sent a request while asleep"
    assert both_awake(recorders) == [], "a wake was asked before the other server slept"
    wakes = _wake_times(metrics)
    assert min(wakes.get("a", 0), wakes.get("b", 0)) >= 2, wakes
    assert woken.done
    assert woken.eval_count == 4, "vLLM's own count, through Ollama's API"
    assert woken_text, "real tokens, decoded"
    assert (woken.load_duration or 0) >= 500_000_000, "the wake (0.5 s at least) it waited for"
    print(f"\nreal vLLM wakes through swapgate: {_wake_seconds(metrics)}")
    assert failed.status_code == 503, failed.text
    assert failures <= 1, "a failed swap at most, and with nothing put to sleep for it"
    assert known.status_code == 503, known.text
    assert "does not answer" in known.json()["error"]["message"], known.text
    assert known_took < 2, "a model whose server is known down fails at once"
    assert b_codes == [200] * 4, "b answered throughout"
    assert b_still_awake, "b was never put to sleep for a dead a"
    assert b_slept_since == 0
    assert after["backoff_until"] is None, "the instance does not back off for one server"
    assert after["models"]["a"]["unreachable"], after["models"]


def _wake_times(metrics: str) -> dict[str, float]:
    found = re.findall(
        r'swapgate_wake_duration_seconds_count\{instance="gpu",model="(\w+)",'
        r'result="ok"\} (\S+)',
        metrics,
    )
    return {model: float(count) for model, count in found}


def _wake_seconds(metrics: str) -> dict[str, float]:
    sums = re.findall(
        r'swapgate_wake_duration_seconds_sum\{instance="gpu",model="(\w+)",'
        r'result="ok"\} (\S+)',
        metrics,
    )
    counts = _wake_times(metrics)
    return {model: round(float(total) / counts[model], 3) for model, total in sums}


def group(pid: int) -> list[psutil.Process]:
    leader = psutil.Process(pid)
    return [leader, *leader.children(recursive=True)]


def gone(pids: list[int]) -> bool:
    return not any(_running(pid) for pid in pids)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reload(gw: Gateway, config: dict[str, Any]) -> None:
    gw.rewrite_config(config)
    with gw.admin(TOKEN) as admin:
        admin.post("/admin/reload").raise_for_status()


def test_vllm_serve_as_a_process_a_real_cold_start_a_recycle_and_nothing_left_after_sigkill(
    engine: VllmEngine, scratch: Path
) -> None:
    command = {
        "cmd": " ".join(engine.serve("tiny")),
        "ready": "/health",
        "env": engine.env(scratch),
        "stop_timeout": "20s",
    }
    config: dict[str, Any] = {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"poll_interval": "1s", "min_residency": 0, "swap_timeout": "240s"},
        "keepalive": {"early_headers_after": "1s", "interval": "2s"},
        "instances": [
            {
                "name": "node",
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": {"tiny": command},
            }
        ],
    }
    with gateway(config, ENV) as gw:
        started = time.monotonic()
        cold = post(
            gw.url,
            CHAT,
            {"model": "tiny", "messages": HELLO, "max_tokens": 4, "stream": True},
            timeout=STARTUP,
        )
        took = time.monotonic() - started
        eta = admin_state(gw)["models"]["tiny"]["eta_seconds"]["node"]
        first = group(state(gw)["processes"]["tiny"]["pid"])
        # Its group (two processes with torch loaded) is above this recycle_rss: once idle it
        # is restarted. The restart takes the config of the moment: without the limit, once.
        command["recycle_rss"] = "1GiB"
        reload(gw, config)
        wait_for(lambda: state(gw)["models"]["tiny"]["state"] == "loading", timeout=20)
        del command["recycle_rss"]
        reload(gw, config)
        wait_for(lambda: state(gw)["models"]["tiny"]["state"] == "warm", timeout=STARTUP)
        again = chat(gw, "tiny")
        second = group(state(gw)["processes"]["tiny"]["pid"])
        metrics = gw.metrics()
        gw.process.send_signal(signal.SIGKILL)
        gw.process.wait(timeout=15)
        wait_for(lambda: gone([p.pid for p in second]), timeout=30, interval=0.5)

    assert cold.status == 200
    assert cold.first_byte_after < 5, "early headers while vLLM starts"
    comments = [line for line in cold.lines() if line.startswith(": swapgate")]
    assert comments[0].startswith(": swapgate loading tiny on node"), comments
    assert len(comments) >= took / 2 / 2, f"keep-alives every 2 s of a {took:.0f} s start"
    assert "data: [DONE]" in cold.lines()
    assert len(first) >= 3, [p.name() for p in first]
    assert gone([p.pid for p in first]), "the recycle stopped all of the first group"
    assert again.status_code == 200, again.text
    assert metric_value(metrics, "swapgate_process_recycles_total") == 1
    starts = metric_value(metrics, "swapgate_swap_duration_seconds_sum")
    print(f"\nreal vLLM cold start through swapgate: {starts:.1f}s (request waited {took:.1f}s)")
    assert 5 < starts < took + 1
    assert eta == pytest.approx(starts, rel=0.01), "the next start is expected to take as long"


def metric_value(text: str, name: str) -> float:
    match = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert match is not None, f"{name} not in the metrics"
    return float(match[1])
