"""Conversations that survive swaps, against the real llama-server (docs/kv-keep.md): a long
conversation on model a, a swap to b and back, then its next turn. With ``kv_keep`` the engine
reads only the turn's new tokens (its own ``timings.prompt_n``), in about the warm turn's time;
without, it reads the whole prompt again. Both ways teams run llama-server: one server per model
(``kind: process``) and router mode (``kind: llama-router``)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from swapgate.config.gguf import read_gguf
from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import free_port, gateway
from tests.engine.conftest import kv_router

pytestmark = pytest.mark.engine
# ~560 tokens of Gemma's, 14 times a turn's: the bench (bench/conversations.py) runs ~2,800
SYSTEM = "You answer questions about birds of the northern lakes in one short sentence. " * 38
SLOT = ["-np", "1", "--swa-full"]
TOKEN = "kv-admin"  # Gemma 3's sliding window: a restored cache needs it


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def ask(url: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=180)
    answer.raise_for_status()
    reply: dict[str, Any] = answer.json()
    return reply


def after_a_swap(url: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The engine's timings of a conversation's first turn, its second (warm) and its third
    (after a swap to b and back)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    timings = []
    for turn in range(3):
        if turn == 2:
            ask(url, "b", [{"role": "user", "content": "Hi."}])  # a swap away, and back
        history.append({"role": "user", "content": f"Question {turn + 1}: tell me of loons."})
        reply = ask(url, "a", history)
        history.append(reply["choices"][0]["message"])
        timings.append(reply["timings"])
    return timings[0], timings[1], timings[2]


def process_node(engine: LlamaServerEngine, kv: Path | None) -> dict[str, Any]:
    commands = {
        name: {
            "cmd": " ".join([*engine.single(name, "${PORT}", ctx=4096), *SLOT]),
            "ready": "/health",
        }
        for name in ("a", "b")
    }
    node: dict[str, Any] = {
        "name": "node",
        "kind": "process",
        "capacity": 1,
        "start_port": free_port(),
        "commands": commands,
    }
    if kv is not None:
        node["kv_keep"] = {"dir": str(kv), "budget": "1GiB"}
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"min_residency": 0},
        "instances": [node],
    }


@pytest.mark.parametrize("kept", [True, False], ids=["kv_keep", "without"])
def test_process_a_conversations_next_turn_after_a_swap(
    engine: LlamaServerEngine, tmp_path: Path, kept: bool, umask_022: None
) -> None:
    env = {"TEST_ADMIN_TOKEN": TOKEN}
    with gateway(process_node(engine, tmp_path / "kv" if kept else None), env) as gw:
        first, warm, after = after_a_swap(gw.url)
        saves = gw.metric("swapgate_kv_saves_total", result="ok")
        restores = gw.metric("swapgate_kv_restores_total", result="ok")
        with gw.admin(TOKEN) as admin:
            saved = admin.get("/admin/state").json()["instances"][0]["kv_saved"]
    print(
        f"\nprocess, kv_keep {kept}: turn after the swap read {after['prompt_n']} tokens in "
        f"{after['prompt_ms']:.0f} ms (warm: {warm['prompt_n']} in {warm['prompt_ms']:.0f} ms, "
        f"first: {first['prompt_n']} in {first['prompt_ms']:.0f} ms)"
    )
    assert first["prompt_n"] > 400, first
    assert warm["prompt_n"] < 40, warm
    if kept:
        assert after["prompt_n"] < 40, f"only the new tokens were read: {after}"
        assert (saves, restores) >= (1, 1)
        folder = tmp_path / "kv" / "node"
        assert list(folder.glob("a--*.bin")), "a's conversation on disk"
        # Token ids decode straight back to the conversation: private whatever the umask
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
        assert modes == dict.fromkeys(modes, 0o600), modes
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert saved["count"] >= 1, saved
        # at least the first turn's KV: its tokens times the model's bytes per token
        per_token = read_gguf(str(engine.gguf)).kv_per_token("f16")
        assert saved["bytes"] > first["prompt_n"] * per_token, saved
    else:
        assert after["prompt_n"] > 400, f"the whole prompt again: {after}"
        assert (saves, restores) == (0, 0)
        assert saved is None, "no kv_keep: nothing saved"


def test_router_a_conversations_next_turn_after_a_swap(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    with kv_router(engine, tmp_path, slots=1, ctx=4096) as config, gateway(config) as gw:
        first, warm, after = after_a_swap(gw.url)
        restores = gw.metric("swapgate_kv_restores_total", result="ok")
    print(
        f"\nrouter: turn after the swap read {after['prompt_n']} tokens in "
        f"{after['prompt_ms']:.0f} ms (warm: {warm['prompt_n']} in {warm['prompt_ms']:.0f} ms)"
    )
    assert first["prompt_n"] > 400, first
    assert after["prompt_n"] < 40, f"only the new tokens were read: {after}"
    assert restores == 1
