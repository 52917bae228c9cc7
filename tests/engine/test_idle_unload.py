"""Idle unload with real engines (docs/configuration.md, "Idle unload: ttl and keep_alive"):
llama.cpp's ``llama-server`` run by ``kind: process`` goes once idle its model's ``ttl``, or
right after an answer whose request sent Ollama's ``keep_alive: 0`` through the openai SDK's
``extra_body``; ``allow_keep_alive: false`` ignores it; a copy serving a long answer stays.
The same through the real llama-swap (v250), which is told to unload and has no ttl of its own."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaServerEngine, LlamaSwapEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import Gateway, gateway, wait_for
from tests.e2e.test_process import ENV, TOKEN, alive, processes, sim_command
from tests.engine.conftest import process_node
from tests.engine.test_llama_swap import LlamaSwap, llama_swap

pytestmark = pytest.mark.engine
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def server() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def config(commands: dict[str, str], models: dict[str, Any]) -> dict[str, Any]:
    """One ``kind: process`` instance that holds every model of ``commands`` at once."""
    single = {m: {"cmd": cmd, "ready": "/health"} for m, cmd in commands.items()}
    return {**process_node(single, capacity=len(commands)), "models": models}


def llama(engine: LlamaServerEngine, *models: str) -> dict[str, str]:
    return {m: " ".join(engine.single(m)) for m in models}


def model_state(gw: Gateway, model: str) -> dict[str, Any] | None:
    with gw.admin(TOKEN) as admin:
        models: dict[str, Any] = admin.get("/admin/state").json()["instances"][0]["models"]
    return models.get(model)  # cold ones are left out


def pid_of(gw: Gateway, model: str) -> int | None:
    pid: int | None = processes(gw).get(model, {}).get("pid")
    return pid


def unloads(gw: Gateway, model: str, reason: str) -> float:
    return gw.metric("swapgate_unloads_total", model=model, reason=reason)


def test_a_model_idle_its_ttl_is_unloaded_and_its_llama_server_stops(
    server: LlamaServerEngine,
) -> None:
    conf = config(llama(server, "gemma-a"), {"gemma-a": {"ttl": "2s"}})
    with gateway(conf, ENV) as gw, gw.sdk(timeout=120) as sdk:
        sdk.chat.completions.create(model="gemma-a", **CHAT)
        answered = time.monotonic()
        pid = pid_of(gw, "gemma-a")
        assert pid is not None
        assert alive(pid)
        state = model_state(gw, "gemma-a")
        assert state is not None
        assert state["state"] == "warm"
        assert state["idle_unload_at"] is not None  # /admin/state shows when it goes
        wait_for(lambda: pid_of(gw, "gemma-a") is None, timeout=15)
        took = time.monotonic() - answered
        assert 1.5 < took < 8, took
        assert not alive(pid)
        assert model_state(gw, "gemma-a") is None  # cold
        assert unloads(gw, "gemma-a", "ttl") == 1
        assert unloads(gw, "gemma-a", "keep_alive") == 0
        # The next request loads it again, as any cold model
        assert sdk.chat.completions.create(model="gemma-a", **CHAT).choices
        assert pid_of(gw, "gemma-a") not in (None, pid)


def test_keep_alive_zero_through_extra_body_unloads_right_after_the_answer_unless_disallowed(
    server: LlamaServerEngine,
) -> None:
    models = {"gemma-a": {}, "gemma-b": {"allow_keep_alive": False}}
    with gateway(config(llama(server, *models), models), ENV) as gw, gw.sdk(timeout=120) as sdk:
        sdk.chat.completions.create(model="gemma-b", extra_body={"keep_alive": 0}, **CHAT)
        kept = pid_of(gw, "gemma-b")
        answer = sdk.chat.completions.with_raw_response.create(
            model="gemma-a", extra_body={"keep_alive": 0}, **CHAT
        )
        assert answer.status_code == 200  # llama-server never saw the field
        answered = time.monotonic()
        # gemma-a has no ttl: only its request's keep_alive unloads it. "Right after" is the
        # unload's own time, llama-server's stop included: 4 s once on a loaded CI machine
        wait_for(lambda: pid_of(gw, "gemma-a") is None, timeout=20)
        assert time.monotonic() - answered < 10
        assert unloads(gw, "gemma-a", "keep_alive") == 1
        time.sleep(1.5)  # gemma-b's keep_alive: 0 is ignored: it stays
        assert kept is not None
        assert pid_of(gw, "gemma-b") == kept
        assert alive(kept)
        assert unloads(gw, "gemma-b", "keep_alive") == 0


def test_a_bad_keep_alive_is_a_400_that_says_what_to_send(server: LlamaServerEngine) -> None:
    with gateway(config(llama(server, "gemma-a"), {}), ENV) as gw:
        body = {"model": "gemma-a", **CHAT, "keep_alive": "soon"}
        refused = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
        assert refused.status_code == 400
        assert '"5m"' in refused.json()["error"]["message"]


def test_a_copy_serving_a_long_answer_is_not_unloaded_while_it_serves() -> None:
    # swapgate's simulator as the engine, run by kind: process: it streams 20 tokens a second
    commands = {"slow": sim_command("slow", startup=0, flags="--token-rate 20")}
    with gateway(config(commands, {"slow": {"ttl": "1s"}}), ENV) as gw:
        body = {**CHAT, "model": "slow", "stream": True, "max_tokens": 70}  # about 3.5 s
        seen: list[int | None] = []

        def watch() -> None:
            time.sleep(2.0)  # past its ttl, mid-answer
            seen.append(pid_of(gw, "slow"))

        watcher = threading.Thread(target=watch)
        events = 0
        with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):  # not the keep-alive comments of a slow start
                    if events == 0:
                        watcher.start()  # from its first token
                    events += 1
        watcher.join()
        ended = time.monotonic()
        assert events > 40
        assert seen == [seen[0]]
        assert seen[0] is not None  # alive mid-answer
        wait_for(lambda: pid_of(gw, "slow") is None, timeout=10)
        assert time.monotonic() - ended > 0.5  # its ttl counted from the answer's end
        assert unloads(gw, "slow", "ttl") == 1


def test_ttl_and_keep_alive_unload_through_a_real_llama_swap(
    swap_engine: LlamaSwapEngine, tmp_path: Path
) -> None:
    with llama_swap(swap_engine, tmp_path, {}) as swap:
        listed = ["gemma-a", "gemma-b"]
        conf = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "1s", "min_residency": 0},
            "instances": [{"name": "ls", "kind": "llama-swap", "url": swap.url, "models": listed}],
            "models": {"gemma-a": {"ttl": "2s"}},
        }
        with gateway(conf, ENV) as gw, gw.sdk(timeout=120) as sdk:
            sdk.chat.completions.create(model="gemma-a", **CHAT)
            answered = time.monotonic()
            assert running(swap) == {"gemma-a"}
            wait_for(lambda: "gemma-a" not in running(swap), timeout=15)
            assert 1.5 < time.monotonic() - answered < 8
            wait_for(lambda: unloads(gw, "gemma-a", "ttl") == 1, timeout=5)  # once it returned
            # gemma-b has no ttl: Open WebUI's keep_alive: 0 unloads it right after its answer
            sdk.chat.completions.create(model="gemma-b", extra_body={"keep_alive": 0}, **CHAT)
            answered = time.monotonic()
            wait_for(lambda: "gemma-b" not in running(swap), timeout=10)
            assert time.monotonic() - answered < 4
            wait_for(lambda: unloads(gw, "gemma-b", "keep_alive") == 1, timeout=5)
            assert unloads(gw, "gemma-a", "keep_alive") == unloads(gw, "gemma-b", "ttl") == 0


def running(swap: LlamaSwap) -> set[str]:
    """The models llama-swap runs now, as its own ``/running`` says."""
    return {m for m, state in swap.running().items() if state in ("ready", "starting")}
