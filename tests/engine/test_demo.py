"""``swapgate demo --engine llama.cpp`` (``make run ENGINE=llama.cpp``): real servers, real text."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.processes import free_port, spawn, stop, wait_for, wait_until_serving

pytestmark = pytest.mark.engine
DEMO = Path(__file__).parents[2] / "config" / "demo-llama-cpp.yaml"


def test_the_real_demo_answers_with_the_engines_text_and_leaves_no_process(
    engine, tmp_path
) -> None:
    config = yaml.safe_load(DEMO.read_text())
    config["server"] |= {"port": free_port(), "log_level": "warning"}
    for instance in config["instances"]:  # the demo's own ports may be taken here
        instance["url"] = f"http://127.0.0.1:{free_port()}"
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(config))
    demo = spawn(["demo", "--engine", "llama.cpp", "--config", str(path)])
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
        assert answer.json()["id"].startswith("chatcmpl-")  # llama-cpp-python's, not the sim's
        assert answer.json()["choices"][0]["message"]["content"].strip()
    finally:
        stop(demo)
    for instance in config["instances"]:  # the servers stop with the demo
        wait_for(lambda url=instance["url"]: not _answers(url), timeout=15)


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/v1/models", timeout=2)
    except httpx.ConnectError:
        return False
    return True
