"""Real processes on loopback for end-to-end tests: simulators and the gateway.

Started with swapgate/tools/processes.py, so each one stops by itself if the test run dies.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from swapgate.tools.processes import free_port, start, stop, wait_until_serving
from tests.e2e.zygote import ZYGOTE

# Where gateways started here record the processes they start (swapgate/drivers/ledger.py):
# one directory per test run, not the user's own.
STATE_DIR = tempfile.mkdtemp(prefix="swapgate-state-")
atexit.register(shutil.rmtree, STATE_DIR, True)


def spawn(
    args: list[str], env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """``swapgate ARGS``, forked from this worker's zygote (tests/e2e/zygote.py): the same
    process ``python -m swapgate`` starts, without importing everything again."""
    return ZYGOTE.fork(args, {"SWAPGATE_STATE_DIR": STATE_DIR, **(env or {})}, log)


@dataclass
class Sim:
    url: str
    process: subprocess.Popen[bytes]

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(f"{self.url}/sim/stats", timeout=5).json()
        return data

    def loads(self) -> int:
        return sum(self.stats()["loads"].values())

    def faults(self, **changes: float) -> None:
        httpx.post(f"{self.url}/sim/faults", json=changes, timeout=5).raise_for_status()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@contextmanager
def simulator(
    flavor: str = "llama-swap",
    models: tuple[str, ...] = ("a", "b"),
    load_time: float = 1.0,
    port: int | None = None,
    **flags: Any,
) -> Iterator[Sim]:
    port = port or free_port()
    args = ["sim", "--flavor", flavor, "--port", str(port), "--models", ",".join(models)]
    args += ["--load-time", str(load_time)]
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    process = spawn(args)
    sim = Sim(f"http://127.0.0.1:{port}", process)
    try:
        wait_until_serving(f"{sim.url}/v1/models", process)
        yield sim
    finally:
        stop(process)


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    config_path: str = ""

    def rewrite_config(self, config: dict[str, Any]) -> None:
        with open(self.config_path, "w") as handle:
            yaml.safe_dump(_with_server(config, self.url), handle)

    def admin(self, token: str | None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def sdk(self, api_key: str = "unused", **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **options)

    def async_sdk(self, api_key: str = "unused") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of every sample of ``name`` whose labels include ``labels``, scraped now."""
        return metric_in(self.metrics(), name, **labels)

    def cli(self, *args: str, token: str | None) -> subprocess.CompletedProcess[str]:
        """``swapgate ARGS`` pointed at this gateway (SWAPGATE_URL), with ``token`` if any."""
        env = {**os.environ, "SWAPGATE_URL": self.url}
        env.pop("SWAPGATE_ADMIN_TOKEN", None)
        if token:
            env["SWAPGATE_ADMIN_TOKEN"] = token
        return subprocess.run(
            [sys.executable, "-m", "swapgate", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )


def instance(name: str, sim: Sim, kind: str = "llama-swap", **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "url": sim.url, **extra}


@contextmanager
def gateway(
    config: dict[str, Any], env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[Gateway]:
    """A gateway serving ``config``; its output goes to ``log`` if given. A port that another
    server took between its choice and the gateway's bind (the suite runs many at once) is
    chosen again: the gateway must be the one listening."""
    for attempt in range(3):
        url = f"http://127.0.0.1:{free_port()}"
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
            yaml.safe_dump(_with_server(config, url), handle)
        process = spawn(["serve", "--config", handle.name], env, log)
        gw = Gateway(url, process, handle.name)
        if _listening(process, url) or not _answers(url) or attempt == 2:
            break  # its own port, or it failed for its own reasons: wait_until_serving says
        stop(process)
        os.unlink(handle.name)
    try:
        wait_until_serving(f"{gw.url}/healthz", process)
        yield gw
    finally:
        stop(process)
        os.unlink(handle.name)


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return False
    return True


def _listening(process: subprocess.Popen[bytes], url: str, timeout: float = 60.0) -> bool:
    """Whether ``process`` itself listens on ``url``'s port (False once it exited)."""
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(psutil.Error):
            sockets = psutil.Process(process.pid).net_connections(kind="tcp")
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in sockets):
                return True
        time.sleep(0.05)
    return False


def _with_server(config: dict[str, Any], url: str) -> dict[str, Any]:
    port = int(url.rsplit(":", 1)[1])
    server = {"port": port, "log_level": "warning", **config.get("server", {})}
    return {**config, "server": server}


def metric_in(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` in ``text`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


HELLO = [{"role": "user", "content": "hi"}]


def chat(
    url: str,
    model: str,
    max_tokens: int = 3,
    timeout: float = 30,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> httpx.Response:
    """One chat completion of ``model`` (not streamed) from the gateway or server at ``url``."""
    body = {"model": model, "messages": HELLO, "max_tokens": max_tokens, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


__all__ = ["free_port", "start", "stop", "wait_until_serving"]
