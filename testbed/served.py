"""What a gateway's ``process`` instance runs, read off the engine itself: where it listens,
and the prompt tokens it read (the tests and benchmarks of docs/kv-keep.md)."""

from __future__ import annotations

import re

import httpx
import psutil


def engine_url(gateway_pid: int, model: str) -> str:
    """Where the gateway's process instance runs ``model``'s llama-server now."""
    for child in psutil.Process(gateway_pid).children(recursive=True):
        cmd = child.cmdline()
        if "--alias" in cmd and cmd[cmd.index("--alias") + 1] == model and "--port" in cmd:
            return f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    raise LookupError(f"no llama-server of {model} under the gateway (pid {gateway_pid})")


def prompt_tokens_read(url: str) -> int:
    """The prompt tokens the engine read since it started (not those its cache spared)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.MULTILINE)
    if found is None:
        raise LookupError(f"{url}/metrics has no prompt_tokens_total (--metrics?): {text[:200]}")
    return int(float(found.group(1)))
