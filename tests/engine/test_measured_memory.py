"""Measured memory with a real ``llama-server`` under ``kind: process`` (docs/memory.md,
"Measured memory"): a model declared far too small (1 MiB) is measured after its load at its
process group's resident size; the gateway warns, shows both figures, and no longer loads a
second model beside it on an instance whose ``memory`` holds both by the declared figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import Gateway, gateway, wait_for
from tests.e2e.test_process import ENV, TOKEN, processes
from tests.engine.conftest import process_node
from tests.engine.test_llama_server import llama_servers_under

pytestmark = pytest.mark.engine
MiB = 2**20
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}
# 1 MiB + 992 MiB fit the instance's 1 GiB by the declared figures; a real llama-server with
# the tiny model takes tens of MiB resident, so gemma-b no longer fits beside gemma-a.
DECLARED = {"gemma-a": "1MiB", "gemma-b": "992MiB"}


@pytest.fixture(scope="module")
def server() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def config(engine: LlamaServerEngine) -> dict[str, Any]:
    commands = {m: {"cmd": " ".join(engine.single(m)), "ready": "/health"} for m in DECLARED}
    node = process_node(commands, memory="1GiB")
    del node["instances"][0]["capacity"]  # memory alone limits what is resident
    node["models"] = {model: {"memory": size} for model, size in DECLARED.items()}
    return node


def sizes(gw: Gateway) -> dict[str, Any]:
    state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    found: dict[str, Any] = state.json()["instances"][0]["model_sizes"]
    return found


def ask(gw: Gateway, model: str) -> None:
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": model}, timeout=60)
    assert answer.status_code == 200, answer.text


def test_a_model_declared_too_small_is_measured_warned_of_and_placed_by_it(
    server: LlamaServerEngine, tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    with gateway(config(server), ENV, log=log) as gw:
        ask(gw, "gemma-a")
        wait_for(lambda: "measured" in sizes(gw)["gemma-a"], timeout=15)
        figures = sizes(gw)["gemma-a"]
        assert figures["estimate"] == MiB
        assert figures["measured_by"] == "rss"
        assert figures["measured"] > 16 * MiB, figures  # a llama-server's resident size
        assert figures["placed_by"] == figures["measured"]
        said = log.read_text()
        assert "gemma-a on node takes" in said
        assert "above its declared 1 MiB" in said
        assert "raise models.gemma-a.memory" in said
        measured = gw.metric("swapgate_model_memory_bytes", model="gemma-a", source="measured")
        assert measured >= figures["measured"]
        declared = gw.metric("swapgate_model_memory_bytes", model="gemma-a", source="declared")
        assert declared == MiB

        plan = gw.cli("plan", gw.config_path, "--measured", token=TOKEN)
        assert plan.returncode == 1, plan.stderr  # it warns
        assert "MEASURED" in plan.stdout
        assert "gemma-a: measured at" in plan.stdout
        assert "gemma-a + gemma-b" not in plan.stdout, "no longer fit at once by the plan"

        ask(gw, "gemma-b")  # 1 MiB + 992 MiB fit 1 GiB; gemma-a's real size + 992 MiB do not
        wait_for(lambda: "pid" not in processes(gw)["gemma-a"], timeout=15)
        assert "pid" in processes(gw)["gemma-b"]
        assert len(llama_servers_under(gw.process.pid)) == 1
        assert sizes(gw)["gemma-a"]["measured"] >= figures["measured"], "kept after its unload"
