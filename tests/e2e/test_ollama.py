"""Ollama's API and llama.cpp's router API in front of a fleet (docs/compatibility.md), with
Ollama's own libraries for Python and JavaScript (under node), LangChain's ChatOllama and a chat
web UI with an Ollama connection (ollama-chat, from PyPI) in Chromium as the clients: chat and
generate streamed and not across a swap of 2.5 s (keep-alive lines they read as nothing,
``load_duration`` telling the swap), tools, embeddings, the catalog (list, show, ps), pull with
its progress, loads and unloads, and errors before and after the 200."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
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

from swapgate.tools.processes import free_port, start, stop, wait_until_serving
from testbed.engines import ensure_ollama_chat_ui, ensure_ollama_js
from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
LOAD = 2.5  # past early_headers_after (500 ms): a swap commits the answer and keeps it alive
NS = 1_000_000_000
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


class Fleet:
    def __init__(self, gw: Gateway, sim: Sim) -> None:
        self.gw, self.sim = gw, sim
        self._client = ollama.Client(host=gw.url, timeout=30)

    def client(self) -> ollama.Client:
        return self._client

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def cold(self, model: str) -> None:
        """``model`` unloaded, so the next request for it swaps."""
        answer = httpx.post(f"{self.gw.url}/models/unload", json={"model": model}, timeout=10)
        assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with (
        simulator(models=("a", "b"), load_time=LOAD) as sim,
        # its load fails well after early_headers_after (500 ms): its error is told after the 200
        simulator(models=("bad",), load_time=1.5, fail_load_rate=1.0) as failing,
    ):
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "500ms", "interval": "1s"},
            "instances": [instance("gpu", sim), instance("broken", failing)],
            "models": {"a": {"capabilities": ["tools"]}, "b": {}, "bad": {}},
        }
        with gateway(config) as gw:
            made = Fleet(gw, sim)
            yield made
            made.close()


def test_a_streamed_chat_across_a_swap_reads_keepalives_as_nothing(fleet: Fleet) -> None:
    fleet.cold("a")
    ask = [{"role": "user", "content": "hello there"}]
    parts = list(fleet.client().chat(model="a", messages=ask, stream=True))
    *pieces, last = parts
    assert last.done
    assert last.done_reason in ("stop", "length")
    assert not any(p.done for p in pieces)
    empty = [p for p in pieces if not p.message.content]
    assert empty, "a swap of 2.5 s past early_headers_after sends keep-alive lines"
    assert "".join(p.message.content or "" for p in pieces).strip(), "the answer's text"
    assert last.load_duration is not None
    assert last.load_duration >= 2 * NS, "the swap's wait"
    assert last.total_duration is not None
    assert last.total_duration >= last.load_duration
    assert last.eval_count
    assert last.eval_count > 0
    # counted as every endpoint is, by its label, once its record is written: after the answer's
    # last line went out (a loaded machine runs the test's next line first)
    wait_for(
        lambda: fleet.gw.metric("swapgate_endpoint_requests_total", endpoint="ollama_chat") >= 1,
        timeout=10,
    )


def test_a_chat_not_streamed_and_generate_both_ways(fleet: Fleet) -> None:
    client = fleet.client()
    fleet.cold("b")
    answer = client.chat(model="b", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert answer.done
    assert answer.message.role == "assistant"
    assert answer.message.content
    assert answer.load_duration is not None
    assert answer.load_duration >= 2 * NS
    generated = client.generate(model="b", prompt="Once upon a time", system="Be brief.")
    assert generated.done
    assert generated.response
    assert generated.load_duration is not None
    assert generated.load_duration < NS, "b is warm"
    streamed = list(client.generate(model="b", prompt="Tell me more", stream=True))
    assert streamed[-1].done
    assert "".join(p.response or "" for p in streamed).strip()
    raw = client.generate(model="b", prompt="[INST] hi [/INST]", raw=True)
    assert raw.done
    assert raw.response


def test_a_tool_call_comes_back_with_its_arguments_as_an_object(fleet: Fleet) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for stream in (False, True):
        if stream:
            parts = list(fleet.client().chat(model="a", messages=ask, tools=TOOLS, stream=True))
            calls = [c for p in parts for c in (p.message.tool_calls or [])]
        else:
            answer = fleet.client().chat(model="a", messages=ask, tools=TOOLS)
            calls = list(answer.message.tool_calls or [])
        assert calls, f"a tool call (stream={stream})"
        assert calls[0].function.name == "get_weather"
        assert isinstance(calls[0].function.arguments, dict)
    # and its result goes back as a tool message
    history: list[Any] = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
    ]
    history.append({"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"})
    assert fleet.client().chat(model="a", messages=history, tools=TOOLS).done


def test_embeddings_old_and_new(fleet: Fleet) -> None:
    client = fleet.client()
    both = client.embed(model="a", input=["one", "two"])
    assert len(both.embeddings) == 2
    assert all(len(v) > 0 for v in both.embeddings)
    one = client.embeddings(model="a", prompt="one")
    assert len(one.embedding) > 0


def test_the_catalog_list_show_ps_and_version(fleet: Fleet) -> None:
    client = fleet.client()
    fleet.client().chat(model="a", messages=[{"role": "user", "content": "hi"}])
    names = {m.model for m in client.list().models}
    assert {"a", "b", "bad"} <= names
    shown = client.show("a")
    assert shown.capabilities is not None
    assert "tools" in shown.capabilities
    running = {m.model: m for m in client.ps().models}
    assert "a" in running
    assert running["a"].expires_at is not None
    assert httpx.get(f"{fleet.gw.url}/api/version").json()["version"]
    assert httpx.head(f"{fleet.gw.url}/").status_code == 200


def test_pull_loads_a_configured_model_with_progress(fleet: Fleet) -> None:
    fleet.cold("b")
    statuses = [p.status for p in fleet.client().pull("b", stream=True)]
    assert statuses[-1] == "success"
    assert any(s and s.startswith("loading b on gpu") for s in statuses), statuses
    running = {m.model for m in fleet.client().ps().models}
    assert "b" in running
    with pytest.raises(ollama.ResponseError) as unknown:
        fleet.client().pull("llama3.2:latest")
    assert unknown.value.status_code == 404
    assert "config" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as deleted:
        fleet.client().delete("a")
    assert deleted.value.status_code == 400
    assert "config" in deleted.value.error


def test_a_promptless_generate_loads_and_keep_alive_zero_unloads(fleet: Fleet) -> None:
    client = fleet.client()
    fleet.cold("b")
    loaded = client.generate(model="b")
    assert loaded.done
    assert loaded.done_reason == "load"
    assert "b" in {m.model for m in client.ps().models}
    unloaded = client.generate(model="b", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert "b" not in {m.model for m in client.ps().models}


def test_errors_before_and_after_the_200_raise_response_error(fleet: Fleet) -> None:
    with pytest.raises(ollama.ResponseError) as unknown:
        fleet.client().chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.status_code == 404
    assert "nope" in unknown.value.error
    # the broken model: its failed load is told after the keep-alives' 200, as the last line
    with pytest.raises(ollama.ResponseError) as failed:
        list(
            fleet.client().chat(
                model="bad", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    assert "bad" in failed.value.error


def test_llama_cpp_router_clients_read_models_and_props(fleet: Fleet) -> None:
    url = fleet.gw.url
    fleet.client().chat(model="a", messages=[{"role": "user", "content": "hi"}])
    fleet.cold("b")
    listed = {m["id"]: m["status"]["value"] for m in httpx.get(f"{url}/models").json()["data"]}
    assert listed["a"] == "loaded"
    assert listed["b"] == "unloaded"
    props = httpx.get(f"{url}/props", params={"model": "b"}).json()
    assert props["model_alias"] == "b"
    assert httpx.get(f"{url}/props").status_code == 400
    loaded = httpx.post(f"{url}/models/load", json={"model": "b"}, timeout=30)
    assert loaded.status_code == 200
    assert loaded.json()["success"] is True
    listed = {m["id"]: m["status"]["value"] for m in httpx.get(f"{url}/models").json()["data"]}
    assert listed["b"] == "loaded"
    unloaded = httpx.post(f"{url}/models/unload", json={"model": "b"}, timeout=30)
    assert unloaded.status_code == 200


# What a node program does with the ollama library for JavaScript: a chat streamed across a
# swap, the model list, a whole generate, and the errors it throws before and after the 200
NODE_SCRIPT = """
import { Ollama } from %(module)s;
const ollama = new Ollama({ host: %(host)s });
const ask = [{ role: 'user', content: 'hello there' }];
const out = {};
const parts = [];
for await (const part of await ollama.chat({ model: 'a', messages: ask, stream: true })) {
  parts.push(part);
}
out.empty = parts.filter((p) => !p.done && !p.message.content).length;
out.text = parts.map((p) => p.message.content).join('');
out.last = parts[parts.length - 1];
out.models = (await ollama.list()).models.map((m) => m.name);
out.generated = (await ollama.generate({ model: 'a', prompt: 'hi', stream: false })).response;
try {
  for await (const p of await ollama.chat({ model: 'bad', messages: ask, stream: true })) {}
} catch (e) { out.after = { name: e.name, message: e.message }; }
try {
  await ollama.chat({ model: 'nope', messages: ask, stream: false });
} catch (e) { out.before = { name: e.name, message: e.message, status: e.status_code }; }
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node (apt-get install nodejs)")
def test_the_javascript_library_under_node(fleet: Fleet, tmp_path: Path) -> None:
    module = ensure_ollama_js(say=False) / "node_modules" / "ollama" / "dist" / "index.mjs"
    script = tmp_path / "chat.mjs"
    script.write_text(
        NODE_SCRIPT % {"module": json.dumps(module.as_uri()), "host": json.dumps(fleet.gw.url)}
    )
    fleet.cold("a")
    run = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "invalid json" not in run.stderr, "every line it read was JSON"
    out = json.loads(run.stdout)
    assert out["empty"] >= 1, "keep-alive lines through a 2.5 s swap"
    assert out["text"].strip()
    assert out["last"]["done"] is True
    assert out["last"]["load_duration"] >= 2 * NS
    assert {"a", "b", "bad"} <= set(out["models"])
    assert out["generated"]
    # After the 200 the library throws a plain Error with the line's words (its stream reader
    # does, for any line with an "error"); before it, its ResponseError with the status
    assert out["after"]["name"] == "Error"
    assert "bad" in out["after"]["message"]
    assert out["before"]["name"] == "ResponseError"
    assert out["before"]["status"] == 404


def test_langchains_chat_ollama_streams_across_a_swap_and_calls_a_tool(fleet: Fleet) -> None:
    llm = ChatOllama(model="a", base_url=fleet.gw.url)
    fleet.cold("a")
    try:
        chunks = list(llm.stream("hello there"))
        called = llm.bind_tools(TOOLS).invoke("What is the weather in Paris?")
    finally:
        llm._client.close()  # type: ignore[no-untyped-call]  # it keeps its own, never closed
    assert "".join(str(c.content) for c in chunks).strip()
    assert called.tool_calls, called
    assert called.tool_calls[0]["name"] == "get_weather"
    assert isinstance(called.tool_calls[0]["args"], dict)


@contextmanager
def chat_ui(gw: Gateway, folder: Path) -> Iterator[str]:
    """The ollama-chat web UI (PyPI) with its Ollama connection set to swapgate: its URL."""
    command = ensure_ollama_chat_ui(say=False)
    settings = folder / "ollama-chat.json"
    settings.write_text(json.dumps({"conversations": []}))
    port = free_port()
    env = {"OLLAMA_HOST": gw.url, "HOME": str(folder)}
    process = start(
        [str(command), "-c", str(settings), "-p", str(port), "-n", "-q"],
        env,
        log=folder / "ui.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(url, process)
        yield url
    finally:
        stop(process)


def test_a_chat_ui_with_an_ollama_connection_lists_and_chats_across_a_swap(
    fleet: Fleet, browser: WebDriver, tmp_path: Path
) -> None:
    fleet.cold("b")
    loads = fleet.sim.stats()["loads"].get("b", 0)
    with chat_ui(fleet.gw, tmp_path) as ui:
        browser.get(f"{ui}/#var.vView='models'")
        pick = WebDriverWait(browser, 30).until(
            lambda page: page.find_element(By.XPATH, "//a[normalize-space()='b']")
        )
        names = {e.text for e in browser.find_elements(By.XPATH, "//a")}
        assert {"a", "b", "bad"} <= names, "the model list came from /api/tags"
        pick.click()
        WebDriverWait(browser, 15).until(lambda page: "Current Model" in page.page_source)
        browser.find_element(By.XPATH, "//a[normalize-space()='Start Conversation']").click()
        prompt = WebDriverWait(browser, 15).until(
            lambda page: page.find_element(By.CSS_SELECTOR, "input#ollama-chat-prompt")
        )
        prompt.send_keys("Hello from the browser", Keys.ENTER)
        # b loads for 2.5 s first: the keep-alive lines, then its words, stream into the page
        answer = WebDriverWait(browser, 60).until(
            lambda page: "Hello from b" in page.find_element(By.TAG_NAME, "body").text
        )
        assert answer
    assert fleet.sim.stats()["loads"]["b"] == loads + 1, "the UI's chat waited for b's swap"
