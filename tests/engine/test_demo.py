"""``swapgate demo --engine llama.cpp|llama-server|llama-swap`` (``make run ENGINE=…``): real
servers, real text, and no server or temporary folder left once the demo stops."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from testbed.engines import LlamaServerEngine, ensure_llama_server
from tests.e2e.processes import free_port, spawn, stop, wait_for, wait_until_serving

pytestmark = pytest.mark.engine
CONFIGS = Path(__file__).parents[2] / "config"
# engine -> (its demo config, the fixture that builds it, the path its servers answer)
ENGINES = {
    "llama.cpp": ("demo-llama-cpp.yaml", "engine", "/v1/models"),
    "llama-server": ("demo-llama-server.yaml", "server_engine", "/models"),
    "llama-swap": ("demo-llama-swap.yaml", "swap_engine", "/health"),
}


@pytest.fixture(scope="module")
def server_engine() -> LlamaServerEngine:
    return ensure_llama_server()


@pytest.mark.parametrize("name", ENGINES)
def test_the_real_demo_answers_with_the_engines_text_and_leaves_no_process(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    file, fixture, health = ENGINES[name]
    request.getfixturevalue(fixture)  # built once per machine, before the demo's clock starts
    config = yaml.safe_load((CONFIGS / file).read_text())
    config["server"] |= {"port": free_port(), "log_level": "warning"}
    for instance in config["instances"]:  # the demo's own ports may be taken here
        instance["url"] = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    scratch = tmp_path / "tmp"  # the demo's temporary folders, and nothing else's
    scratch.mkdir()
    demo = spawn(["demo", "--engine", name, "--config", str(path)], {"TMPDIR": str(scratch)})
    base = f"http://127.0.0.1:{config['server']['port']}"
    try:
        wait_until_serving(f"{base}/readyz", demo, timeout=120)
        body = {
            "model": "gemma-chat",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
        }
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"].startswith("chatcmpl-")  # the engine's, not the sim's
        assert answer.json()["choices"][0]["message"]["content"].strip()
    finally:
        stop(demo)
    for instance in config["instances"]:  # the servers stop with the demo
        wait_for(lambda url=instance["url"]: not _answers(url + health), timeout=15)
    # SIGTERM unwinds it as Ctrl-C would: uvicorn raises the signal again once the gateway is
    # down, and the process died there, its folders left behind
    assert demo.returncode == 143
    assert list(scratch.iterdir()) == [], "its temporary folders removed"


def _answers(url: str) -> bool:
    """Whether a server still listens at ``url``: one that closes the connection without an
    answer is still there, on its way out (a busy run saw that)."""
    try:
        httpx.get(url, timeout=2)
    except httpx.ConnectError:
        return False
    except httpx.TransportError:
        return True
    return True
