"""``models.M.params`` and ``/v1/models``'s context and capabilities against a real llama-server
(``kind: process``): the forced temperature shows in the engine's own ``/slots``, a stripped key
never reaches it, the capture holds the changed body, and ``/v1/models`` tells the context the
engine's ``/props`` reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import Gateway, gateway, wait_for
from tests.e2e.test_process import ENV, TOKEN, processes
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def _config(server: LlamaServerEngine, tmp_path: Path) -> dict[str, Any]:
    config = process_node(
        {
            "gemma-a": {"cmd": " ".join(server.single("gemma-a", ctx=1024)), "ready": "/health"},
            "gemma-b": {"cmd": " ".join(server.single("gemma-b")), "ready": "/health"},
        }
    )
    config["models"] = {
        "gemma-a": {
            "params": {
                "set": {"temperature": 0.33},
                "default": {"top_k": 7},
                "strip": ["logprobs", "top_logprobs"],
            },
            "capabilities": ["tools"],
        },
        "gemma-b": {"context": 4096, "capabilities": ["reasoning"]},
    }
    config["activity"] = {"path": str(tmp_path / "activity.sqlite3")}
    config["capture"] = {"models": ["gemma-a"]}
    return config


def _slot_params(gw: Gateway, model: str) -> dict[str, Any]:
    """What the engine itself last sampled with (llama-server's ``/slots``)."""
    port = processes(gw)[model]["port"]
    slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=5).json()
    params: dict[str, Any] = slots[0]["params"]
    return params


def _listed(gw: Gateway) -> dict[str, dict[str, Any]]:
    data = httpx.get(f"{gw.url}/v1/models", timeout=10).json()["data"]
    return {entry["id"]: entry for entry in data}


def test_params_reach_a_real_llama_server_and_v1_models_tells_its_context(
    server: LlamaServerEngine, tmp_path: Path
) -> None:
    with gateway(_config(server, tmp_path), ENV) as gw:
        before = _listed(gw)
        assert before["gemma-b"]["context"] == 4096  # from its config, never loaded
        assert before["gemma-b"]["capabilities"] == ["reasoning"]
        assert "context" not in before["gemma-a"]  # not warm yet, and no context configured

        body = {
            "model": "gemma-a",
            "messages": HELLO,
            "max_tokens": 2,
            "temperature": 1.7,
            "top_k": 3,
            "logprobs": True,
            "top_logprobs": 2,
        }
        answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0].get("logprobs") is None, "logprobs were stripped"
        sampled = _slot_params(gw, "gemma-a")
        assert sampled["temperature"] == pytest.approx(0.33)  # set: over the client's 1.7
        assert sampled["top_k"] == 3  # default: the client's own kept

        with gw.admin(TOKEN) as admin:
            kept = admin.get(f"/admin/captures/{answer.headers['x-request-id']}").json()
        captured = json.loads(kept["request"]["body"])
        assert captured["temperature"] == 0.33
        assert "logprobs" not in captured
        assert "top_logprobs" not in captured

        messages = {"model": "gemma-a", "max_tokens": 2, "messages": HELLO, "temperature": 1.0}
        answer = httpx.post(f"{gw.url}/v1/messages", json=messages, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-swapgate-translated"] == "chat-completions"
        sampled = _slot_params(gw, "gemma-a")
        assert sampled["temperature"] == pytest.approx(0.33)  # through the translation
        assert sampled["top_k"] == 7  # default: the client sent none

        # its engine's /props: a slot of 1024 tokens; tools from its config
        wait_for(lambda: _listed(gw)["gemma-a"].get("context") == 1024, timeout=10)
        assert _listed(gw)["gemma-a"]["capabilities"] == ["tools"]
