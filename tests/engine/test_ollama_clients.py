"""Ollama's clients through swapgate in front of real engines (docs/compatibility.md, "Ollama's
API"): llama.cpp's ``llama-server`` run by ``kind: process`` and the real llama-swap (v250), one
model at a time, so each change of model is a real swap. The ``ollama`` Python library streams
across it and is told the swap in ``load_duration``; the engine's own token counts come back;
``/api/ps`` and ``/api/show`` say what runs; LangChain's ChatOllama answers; llama.cpp router
clients read the engine's own ``/props``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import ollama
import pytest
from langchain_ollama import ChatOllama

from testbed.engines import LlamaServerEngine, LlamaSwapEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import Gateway, gateway
from tests.engine.conftest import process_node
from tests.engine.test_llama_swap import llama_swap

pytestmark = pytest.mark.engine
ASK = [{"role": "user", "content": "Say hello."}]
OPTIONS = {"num_predict": 8, "temperature": 0}
KEEPALIVE = {"early_headers_after": "200ms", "interval": "200ms"}


@pytest.fixture(scope="module")
def server() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


@pytest.fixture(scope="module")
def process_gateway(server: LlamaServerEngine) -> Iterator[Gateway]:
    commands = {m: {"cmd": " ".join(server.single(m)), "ready": "/health"} for m in ("a", "b")}
    config = {**process_node(commands), "keepalive": KEEPALIVE}
    with gateway(config) as gw:
        yield gw


@pytest.fixture(scope="module")
def swap_gateway(
    swap_engine: LlamaSwapEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("llama-swap")
    with llama_swap(swap_engine, root, {}) as swap:
        config = {
            "routing": {"min_residency": 0, "poll_interval": "1s"},
            "keepalive": KEEPALIVE,
            "instances": [
                {
                    "name": "swap",
                    "kind": "llama-swap",
                    "url": swap.url,
                    "models": ["gemma-a", "gemma-b"],
                }
            ],
        }
        with gateway(config) as gw:
            yield gw


def swaps_across(gw: Gateway, first: str, second: str) -> None:
    """A chat streamed to ``first`` then ``second`` (each a swap on a capacity-1 instance): whole
    answers with the engine's counts, and ``load_duration`` the wait for each swap."""
    client = ollama.Client(host=gw.url, timeout=120)
    try:
        for model in (first, second):
            parts = list(client.chat(model=model, messages=ASK, stream=True, options=OPTIONS))
            last = parts[-1]
            assert last.done
            assert "".join(p.message.content or "" for p in parts).strip(), model
            assert (last.prompt_eval_count or 0) > 1, "the engine's count"
            assert (last.eval_count or 0) > 0
            assert last.load_duration is not None
            assert last.load_duration > 100_000_000, f"{model} was loaded for this request"
            assert model in {m.model for m in client.ps().models}
        warm = client.chat(model=second, messages=ASK, options=OPTIONS)
        assert warm.load_duration is not None
        assert warm.load_duration < 100_000_000, "warm: no wait"
    finally:
        client.close()  # type: ignore[no-untyped-call]


def test_the_python_library_across_llama_server_swaps(process_gateway: Gateway) -> None:
    swaps_across(process_gateway, "a", "b")
    client = ollama.Client(host=process_gateway.url, timeout=120)
    try:
        generated = client.generate(model="b", prompt="Once upon a time", options=OPTIONS)
        assert (generated.response or "").strip()
        shown = client.show("b")
        assert shown.modelinfo is not None
        assert shown.modelinfo["swapgate.context_length"] == 2048, "what llama-server said"
    finally:
        client.close()  # type: ignore[no-untyped-call]


def test_router_clients_read_the_engines_own_props(process_gateway: Gateway) -> None:
    with ollama.Client(host=process_gateway.url, timeout=120) as client:
        client.chat(model="a", messages=ASK, options=OPTIONS)
    props: dict[str, Any] = httpx.get(
        f"{process_gateway.url}/props", params={"model": "a"}, timeout=30
    ).json()
    assert props["model_path"], "llama-server's own /props"
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["model_alias"] == "a"
    listed = httpx.get(f"{process_gateway.url}/models", timeout=30).json()["data"]
    assert {m["id"]: m["status"]["value"] for m in listed}["a"] == "loaded"


def test_langchains_chat_ollama_against_llama_server(process_gateway: Gateway) -> None:
    llm = ChatOllama(model="b", base_url=process_gateway.url, num_predict=8, temperature=0)
    try:
        answer = llm.invoke("Say hello.")
    finally:
        llm._client.close()  # type: ignore[no-untyped-call]  # it keeps its own, never closed
    assert str(answer.content).strip()
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] > 0


def test_the_python_library_across_llama_swap_swaps(swap_gateway: Gateway) -> None:
    swaps_across(swap_gateway, "gemma-a", "gemma-b")
