"""Ollama's clients through swapgate in front of real engines (docs/compatibility.md, "Ollama's
API"): llama.cpp's ``llama-server`` run by ``kind: process`` and the real llama-swap (v250), one
model at a time, so each change of model is a real swap. The ``ollama`` Python library streams
across it and is told the swap in ``load_duration``; the engine's own token counts come back;
``/api/ps`` and ``/api/show`` say what runs; the JavaScript library under node, LangChain's
ChatOllama and a chat web UI in Chromium answer; llama.cpp router clients read the engine's own
``/props``. (vLLM: tests/engine/test_vllm.py wakes a server for the Python library.)"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from langchain_ollama import ChatOllama
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from testbed.engines import (
    LlamaServerEngine,
    LlamaSwapEngine,
    ensure_llama_server,
    ensure_ollama_js,
    tiny_weights,
)
from tests.e2e.conftest import headless_chromium
from tests.e2e.processes import Gateway, gateway
from tests.e2e.test_ollama import chat_ui
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


NODE_SCRIPT = """
import { Ollama } from %(module)s;
const ollama = new Ollama({ host: %(host)s });
const out = { runs: [] };
for (const model of ['a', 'b']) {
  const parts = [];
  const ask = { model, messages: [{ role: 'user', content: 'Say hello.' }], stream: true,
                options: { num_predict: 8, temperature: 0 } };
  for await (const part of await ollama.chat(ask)) parts.push(part);
  out.runs.push({ text: parts.map((p) => p.message.content).join(''), last: parts.at(-1) });
}
out.models = (await ollama.list()).models.map((m) => m.name);
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (apt-get install nodejs)")
def test_the_javascript_library_across_llama_server_swaps(
    process_gateway: Gateway, tmp_path: Path
) -> None:
    module = ensure_ollama_js(say=False) / "node_modules" / "ollama" / "dist" / "index.mjs"
    script = tmp_path / "chat.mjs"
    host = process_gateway.url
    script.write_text(
        NODE_SCRIPT % {"module": json.dumps(module.as_uri()), "host": json.dumps(host)}
    )
    run = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "invalid json" not in run.stderr
    out = json.loads(run.stdout)
    for done in out["runs"]:
        assert done["text"].strip()
        assert done["last"]["done"] is True
        assert done["last"]["eval_count"] > 0
    assert {"a", "b"} <= set(out["models"])


def test_a_chat_ui_with_an_ollama_connection_across_a_llama_server_swap(
    process_gateway: Gateway, tmp_path: Path
) -> None:
    with ollama.Client(host=process_gateway.url, timeout=120) as client:
        client.chat(model="a", messages=ASK, options=OPTIONS)  # a warm: b is a swap
    with (
        chat_ui(process_gateway, tmp_path) as ui,
        headless_chromium("1280,1100", "the chat UI test") as browser,
    ):
        browser.get(f"{ui}/#var.vView='models'")
        WebDriverWait(browser, 30).until(
            lambda page: page.find_element(By.XPATH, "//a[normalize-space()='b']")
        ).click()
        WebDriverWait(browser, 15).until(lambda page: "Current Model" in page.page_source)
        browser.find_element(By.XPATH, "//a[normalize-space()='Start Conversation']").click()
        WebDriverWait(browser, 15).until(
            lambda page: page.find_element(By.CSS_SELECTOR, "input#ollama-chat-prompt")
        ).send_keys("Say hello.", Keys.ENTER)
        saved = tmp_path / "ollama-chat.json"

        def answered(_: WebDriver) -> str:
            conversations = json.loads(saved.read_text()).get("conversations") or [{}]
            exchanges = conversations[0].get("exchanges") or [{}]
            return str(exchanges[-1].get("model") or "").strip()

        answer = WebDriverWait(browser, 120).until(answered)
        shown = browser.find_element(By.TAG_NAME, "body").text
    assert answer.split()[0] in shown, "the engine's words, on the page"
