"""What a gateway's ``process`` instance runs, read from the engine itself."""

from __future__ import annotations

import re

import httpx
import psutil

from tests.e2e.processes import Gateway


def engine_url(gw: Gateway, model: str) -> str:
    """Where the gateway's process instance runs ``model``'s llama-server now."""
    for child in psutil.Process(gw.process.pid).children(recursive=True):
        cmd = child.cmdline()
        if "--alias" in cmd and cmd[cmd.index("--alias") + 1] == model and "--port" in cmd:
            return f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    raise AssertionError(f"no llama-server of {model} under the gateway")


def prompt_tokens_read(url: str) -> int:
    """The prompt tokens the engine read since it started (not those its cache spared)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.MULTILINE)
    assert found, text[:500]
    return int(float(found.group(1)))
