"""``kind: process`` (issue 17): swapgate starts and stops a server per model itself.

The simulator is the command here (fast); tests/engine/test_llama_server.py and test_vllm.py run
real engines the same way.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.processes import Gateway, chat, free_port, gateway, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "admin-secret"
ENV = {"TEST_ADMIN_TOKEN": TOKEN}


def sim_command(model: str, startup: float = 0.3, flags: str = "") -> str:
    """``swapgate sim`` serving ``model``, listening ``startup`` seconds after it starts (what a
    model's load looks like to swapgate)."""
    sim = (
        f"{sys.executable} -m swapgate sim --flavor openai --port ${{PORT}} --models {model}"
        f" --token-rate 200 {flags}"
    ).strip()
    return f"/bin/sh -c 'sleep {startup}; exec {sim}'" if startup else sim


def process_config(**commands: str | dict[str, Any]) -> dict[str, Any]:
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"min_residency": 0, "poll_interval": "200ms"},
        "keepalive": {"early_headers_after": "30s"},
        "instances": [
            {
                "name": "node",
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": commands,
            },
        ],
    }


def processes(gw: Gateway) -> dict[str, Any]:
    state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    instance: dict[str, Any] = state.json()["instances"][0]
    procs: dict[str, Any] = instance["processes"]
    return procs


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_each_swap_stops_one_process_and_starts_the_other_and_waiters_share_one_start() -> None:
    config = process_config(a=sim_command("a"), b=sim_command("b"))
    with gateway(config, ENV) as gw:
        first = chat(gw.url, "a", timeout=60)
        assert first.status_code == 200, first.text
        assert first.headers["x-swapgate-route"] == "instance/node"
        a_pid = processes(gw)["a"]["pid"]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: chat(gw.url, "b", timeout=60), range(8)))
        procs = processes(gw)
        metrics = httpx.get(f"{gw.url}/metrics").text
    assert [a.status_code for a in answers] == [200] * 8
    assert {a.json()["model"] for a in answers} == {"b"}
    assert not alive(a_pid)  # b took a's place: capacity 1
    assert "pid" not in procs["a"]
    assert not alive(procs["b"]["pid"])  # the gateway stopped, and its processes with it
    assert 'swapgate_swaps_total{instance="node",model="b",result="ok"} 1.0' in metrics


def test_no_process_outlives_the_gateway_sigterm_or_sigkill() -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        config = process_config(a=sim_command("a", startup=0))
        with gateway(config, ENV) as gw:
            assert chat(gw.url, "a", timeout=60).status_code == 200
            proc = processes(gw)["a"]
            gw.process.send_signal(sig)
            gw.process.wait(timeout=15)
            wait_for(lambda pid=proc["pid"]: not alive(pid), timeout=10)
            with httpx.Client() as client, pytest.raises(httpx.ConnectError):
                client.get(f"http://127.0.0.1:{proc['port']}/v1/models", timeout=2)


def stream_and_kill(gw: Gateway, model: str, after: int, max_tokens: int) -> tuple[int, list[str]]:
    """Stream a long answer from ``model`` (warm) and SIGKILL its process after ``after``
    events; return the process's pid and every event's data."""
    pid: int = processes(gw)[model]["pid"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    events = []
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if len(events) == after:
                    os.kill(pid, signal.SIGKILL)
    return pid, events


def guard_of(gw: Gateway) -> psutil.Process:
    """The gateway's guard (swapgate/drivers/children.py), which it starts with its first server."""
    (guard,) = [
        child
        for child in psutil.Process(gw.process.pid).children()
        if any(part.endswith("children.py") for part in child.cmdline())
    ]
    return guard


def test_a_killed_gateways_servers_stop_whole_sigkill_after_their_stop_timeout() -> None:
    # A server that starts a helper of its own which ignores SIGTERM (a hung engine, a shell's
    # background job): the kernel's SIGTERM stops the server, the guard SIGKILLs the rest of
    # the group after the command's stop_timeout, with no gateway started again.
    command = f"/bin/sh -c 'trap \"\" TERM; sleep 300 & exec {sim_command('a', startup=0)}'"
    config = process_config(a={"cmd": command, "stop_timeout": "1s"})
    with gateway(config, ENV) as gw:
        assert chat(gw.url, "a", timeout=60).status_code == 200
        server = processes(gw)["a"]["pid"]
        (helper,) = [p for p in psutil.Process(server).children() if p.name() == "sleep"]
        guard = guard_of(gw)
        gw.process.kill()
        gw.process.wait(timeout=15)
        wait_for(lambda: not alive(server), timeout=10)
        wait_for(lambda: not alive(helper.pid), timeout=10)
        wait_for(lambda: not alive(guard.pid), timeout=10)


def test_what_a_killed_gateways_process_left_in_its_group_is_stopped_when_the_next_one_starts(
    tmp_path: Path,
) -> None:
    # The guard killed with the gateway (a kill of both, an OOM kill): PR_SET_PDEATHSIG stops
    # the server but not its helper; the record the gateway left does, at the next start.
    command = f"/bin/sh -c 'sleep 300 & exec {sim_command('a', startup=0)}'"
    env = {**ENV, "SWAPGATE_STATE_DIR": str(tmp_path)}
    with gateway(process_config(a=command), env) as gw:
        assert chat(gw.url, "a", timeout=60).status_code == 200
        server = processes(gw)["a"]["pid"]
        (helper,) = [p for p in psutil.Process(server).children() if p.name() == "sleep"]
        assert list(tmp_path.glob("*.json")), "the process is on record while it runs"
        guard_of(gw).kill()
        gw.process.kill()
        gw.process.wait(timeout=15)
        wait_for(lambda: not alive(server))
    assert alive(helper.pid), "the helper outlived its server"
    assert os.getpgid(helper.pid) == server, "in the group swapgate started"
    with gateway(process_config(a=command), env):
        wait_for(lambda: not alive(helper.pid))
    assert not list(tmp_path.glob("*.json")), "and its record is gone"


def test_a_process_killed_mid_stream_ends_the_stream_in_band_and_starts_again() -> None:
    config = process_config(a=sim_command("a", startup=0))
    with gateway(config, ENV) as gw:
        assert chat(gw.url, "a", timeout=60).status_code == 200
        pid, events = stream_and_kill(gw, "a", after=3, max_tokens=2000)
        # The stream ends when the connection breaks; the exit is counted when the process is
        # reaped, which a busy machine does a moment later (and forgets its pid then).
        wait_for(lambda: "pid" not in processes(gw)["a"])
        metrics = httpx.get(f"{gw.url}/metrics").text
        again = chat(gw.url, "a", timeout=60)
        restarted = processes(gw)["a"]
    assert "error" in json.loads(events[-1])
    assert 'swapgate_process_exits_total{instance="node",model="a"} 1.0' in metrics
    assert again.status_code == 200
    assert restarted["pid"] != pid
    assert restarted["ready"] is True


def test_a_command_that_exits_while_starting_fails_the_swap_with_its_last_words() -> None:
    config = process_config(a="/bin/sh -c 'echo cannot open /models/a.gguf; exit 3'")
    config["models"] = {"a": {"max_wait": "5s"}}
    with gateway(config, ENV) as gw:
        started = time.monotonic()
        failed = chat(gw.url, "a", stream=False, timeout=60)
        took = time.monotonic() - started
        output = processes(gw)["a"]["output"]
        logs = gw.cli("logs", "a", token=TOKEN)
        unknown = gw.cli("logs", "a", "--instance", "elsewhere", token=TOKEN)
    assert failed.status_code == 503, failed.text
    assert failed.json()["error"]["code"] == "swap_failed"
    assert took < 5
    assert "cannot open /models/a.gguf" in output
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == ["== node/a (not running) ==", "cannot open /models/a.gguf"]
    assert unknown.returncode == 1
    assert "a has no process on instance elsewhere" in unknown.stderr


def test_a_process_above_recycle_rss_is_drained_and_restarted_when_idle_no_request_fails() -> None:
    # The simulator keeps 30 MiB per request (a leak); it starts at about 50 MiB. On SIGTERM it
    # would finish its streams itself (uvicorn does); an engine that does not is SIGKILLed after
    # stop_timeout, so a restart that did not wait for the streams would cut them.
    leaky = {
        "cmd": sim_command("a", flags="--grow-rss 30MiB"),
        "recycle_rss": "150MiB",
        "stop_timeout": "50ms",
    }
    config = process_config()
    config["instances"][0]["commands"] = {"a": leaky}
    # Streams of 1.5 s: four are running when the limit is crossed.
    body = {
        "model": "a",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 300,
    }

    def stream(_: int) -> list[str]:
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            return [line for line in r.iter_lines() if line.startswith("data: ")]

    with gateway(config, ENV) as gw:
        assert chat(gw.url, "a", timeout=60).status_code == 200
        first_pid = processes(gw)["a"]["pid"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(stream, range(8)))
        series = ("swapgate_process_recycles_total", "swapgate_process_rss_bytes")
        labelled = [f'{name}{{instance="node",model="a"}}' for name in series]
        # The last streams can take the new process past the limit too, and a second recycle
        # drops the RSS series while it runs: keep the one reading that showed both at once.
        seen: list[str] = []

        def recycled_and_measured() -> bool:
            seen[:] = [gw.metrics()]
            return all(name in seen[0] for name in labelled)

        wait_for(recycled_and_measured)
        metrics = seen[0]
        # A second recycle may still be under way, or start right after: the first new process
        # seen serving, kept as it was read.
        served: list[int] = []

        def restarted() -> bool:
            pid = processes(gw)["a"].get("pid")
            served[:] = [] if pid in (None, first_pid) else [pid]
            return bool(served)

        wait_for(restarted, timeout=20)
        last_pid = served[0]
    assert all(events[-1] == "data: [DONE]" for events in answers), "every stream ran to its end"
    assert not any('"error"' in event for events in answers for event in events)
    recycles = re.search(
        r'swapgate_process_recycles_total\{instance="node",model="a"\} (\S+)', metrics
    )
    assert recycles is not None
    assert float(recycles[1]) >= 1
    assert last_pid != first_pid
    assert not alive(first_pid)
    rss = re.search(r'swapgate_process_rss_bytes\{instance="node",model="a"\} (\S+)', metrics)
    assert rss is not None
    assert float(rss[1]) > 40 * 2**20  # a real measurement of the group
    assert 'swapgate_process_exits_total{instance="node",model="a"}' not in metrics


def test_a_load_nobody_waits_for_is_stopped_for_the_model_queued_behind_it() -> None:
    """Issue 23: a's 8 s load loses its only waiter after 1 s while b queues for the instance;
    a's process is stopped and b is warm long before a's load would have finished."""
    config = process_config(a=sim_command("a", startup=8.0), b=sim_command("b"))
    with gateway(config, ENV) as gw, concurrent.futures.ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        gone = pool.submit(httpx.post, f"{gw.url}/v1/chat/completions", json=body, timeout=1.0)
        wait_for(lambda: "a" in processes(gw), timeout=2)
        queued = pool.submit(chat, gw.url, "b", 3, 60)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and disconnects at 1 s
            gone.result()
        answer = queued.result()
        served_after = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        # a's load alone would have ended at 8 s; b takes ~1.5 s, more on a loaded machine
        assert served_after < 6.0, served_after
        assert gw.metric("swapgate_swaps_total", model="a", result="abandoned") == 1
        assert gw.metric("swapgate_swaps_total", model="a", result="ok") == 0
        running = {model for model, proc in processes(gw).items() if "pid" in proc}
        assert running == {"b"}  # a's process was stopped, not left loading


def test_a_server_whose_port_was_taken_while_it_started_is_started_again_on_another(
    tmp_path: Path,
) -> None:
    """The port is free when chosen, but an engine binds it only once its model is loaded:
    here another process binds it first (in a session of its own, as a stranger would be),
    and the server exits."""
    hold = tmp_path / "hold.py"
    hold.write_text(
        "import os, socket, sys, time\n"
        "os.closerange(0, 256)  # nothing of the server's: its output pipe ends with it\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); time.sleep(8)\n"
    )
    mark = tmp_path / "tried"
    first = (
        f"if [ ! -e {mark} ]; then touch {mark}; setsid {sys.executable} {hold} ${{PORT}} &"
        " sleep 0.5; exit 3; fi"
    )
    command = f"/bin/sh -c '{first}; exec {sim_command('a', startup=0)}'"
    with gateway(process_config(a=command), ENV) as gw:
        answer = chat(gw.url, "a", timeout=60)
        assert answer.status_code == 200, answer.text
        assert gw.metric("swapgate_swaps_total", model="a", result="ok") == 1
        assert gw.metric("swapgate_swaps_total", model="a", result="failed") == 0
    assert mark.exists()  # the first start did lose its port
