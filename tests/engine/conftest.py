"""The real engines: llama-cpp-python's OpenAI server, llama-server and llama-swap, serving a tiny
Llama with Gemma-3-270M's tokenizer (``tiny_weights``; docs/compatibility.md).

The engine is built once per machine into a cache (testbed/engines.py); every server here is
a real process on loopback that the test starts and stops.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from testbed.engines import (
    CodingClients,
    LlamaCppEngine,
    LlamaServerEngine,
    LlamaSwapEngine,
    ensure_clis,
    ensure_llama_cpp,
    ensure_llama_swap,
    tiny_weights,
)
from tests.e2e.processes import free_port, start, stop, wait_until_serving

ENGINE_STARTUP = 60.0  # the first model loads before the server listens


@dataclass
class LlamaServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def said(self) -> str:
        return self.log.read_text(errors="replace")

    def generated_counts(self) -> list[int]:
        """Tokens generated per finished completion, from llama.cpp's own timing lines."""
        return [int(n) for n in re.findall(r"\beval time =.*?/\s*(\d+) runs", self.said())]


@pytest.fixture(scope="session")
def engine() -> LlamaCppEngine:
    """llama-cpp-python's server with the tiny Llama that reads text as Gemma does."""
    return tiny_weights(ensure_llama_cpp())


@pytest.fixture(scope="session")
def gemma() -> LlamaCppEngine:
    """llama-cpp-python with Gemma-3-270M itself (its GGUF's facts)."""
    return ensure_llama_cpp()


@pytest.fixture(scope="session")
def clis() -> CodingClients:
    """Claude Code's and Codex's command-line clients (tests/engine/clis.py runs them)."""
    return ensure_clis()


@pytest.fixture(scope="session")
def swap_engine() -> LlamaSwapEngine:
    """llama-swap, built from the project's shared folder (or SWAPGATE_LLAMA_SWAP); its tests
    are skipped, saying so, on a machine with neither."""
    found = ensure_llama_swap()
    if found is None:
        pytest.skip("no llama-swap: no ../shared/engines/llama-swap and no SWAPGATE_LLAMA_SWAP")
    return replace(found, server=tiny_weights(found.server))


@contextmanager
def llama_server(
    engine: LlamaCppEngine, root: Path, models: dict[str, int], interrupt: bool = False
) -> Iterator[LlamaServer]:
    """One llama-cpp-python server with each alias of ``models`` at its ``n_ctx``;
    ``interrupt``: with the engine's default ``interrupt_requests``."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    command = engine.write_config(root / f"llama-{port}.json", port, models, interrupt)
    log = root / f"llama-{port}.log"
    process = start(command, engine.env(), log=log, clean_env=True)
    server = LlamaServer(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_until_serving(f"{server.url}/v1/models", process, timeout=ENGINE_STARTUP)
        yield server
    finally:
        stop(process)


def process_node(commands: dict[str, Any], **instance: Any) -> dict[str, Any]:
    """A gateway config with one ``kind: process`` instance of capacity 1 running ``commands``;
    ``instance``: more of its keys (``kv_keep``)."""
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"min_residency": 0, "poll_interval": "500ms"},
        "instances": [
            {
                "name": "node",
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": commands,
                **instance,
            }
        ],
    }


@contextmanager
def kv_router(
    engine: LlamaServerEngine, root: Path, slots: int, ctx: int
) -> Iterator[dict[str, Any]]:
    """A real llama-server router serving a and b one at a time, each with ``slots`` slots of
    ``ctx`` tokens saved into ``root/kv/router``: the gateway config of a ``kv_keep`` instance in
    front of it."""
    kv = root / "kv"
    (kv / "router").mkdir(parents=True)
    every = {"slot-save-path": str(kv / "router"), "swa-full": "true", "np": str(slots)}
    preset = engine.write_preset(root / "models.ini", {"a": ctx, "b": ctx}, every)
    port = free_port()
    router = start(engine.router(preset, port, max_models=1), log=root / "router.log")
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/models", router, timeout=60)
        yield {
            "routing": {"min_residency": 0},
            "instances": [
                {
                    "name": "router",
                    "kind": "llama-router",
                    "url": f"http://127.0.0.1:{port}",
                    "models": ["a", "b"],
                    "kv_keep": {"dir": str(kv), "budget": "1GiB"},
                }
            ],
        }
    finally:
        stop(router)


def swap_on_request(name: str, server: LlamaServer, models: list[str]) -> dict[str, object]:
    return {
        "name": name,
        "kind": "swap-on-request",
        "url": server.url,
        "models": models,
        "capacity": 1,
    }
