"""Starting and measuring the processes a benchmark compares, all on loopback."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from swapgate.tools.processes import free_port, serving, sim_command

ROOT = Path(__file__).resolve().parents[1]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STARTUP_TIMEOUT = 30.0
FIXED_ANSWER = (
    '{"id":"fixed","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"Hello from the fixed upstream."},'
    '"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":6,"total_tokens":7}}'
)
# A whole nginx.conf that keeps every file under {root}; {servers} are its server blocks.
NGINX_MAIN = """
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {root}/body;
  proxy_temp_path {root}/proxy;
  fastcgi_temp_path {root}/fastcgi;
  uwsgi_temp_path {root}/uwsgi;
  scgi_temp_path {root}/scgi;
  keepalive_requests 1000000;
  # Request bodies stay in memory: one written to {root}/body fails with "Permission denied"
  # when nginx runs as root with workers as nobody (coding clients send 40-100 KB prompts).
  client_body_buffer_size 8m;
  client_max_body_size 64m;
{servers}
}}
"""
FIXED_SERVER = """
  server {{
    listen 127.0.0.1:{port};
    default_type application/json;
    location = /v1/models {{ return 200 '{{"object":"list","data":[{{"id":"m"}}]}}'; }}
    location / {{ return 200 '{answer}'; }}
  }}
"""


@dataclass
class Proc:
    name: str
    url: str
    process: subprocess.Popen[bytes]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def main_thread_cpu_seconds(self) -> float:
        """The CPU of the process's first thread alone (its event loop's, for a gateway)."""
        pid = self.process.pid
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")


@contextmanager
def running(
    name: str,
    command: list[str],
    url: str,
    env: dict[str, str] | None = None,
    log: int | None = None,
) -> Iterator[Proc]:
    """``log``: where its output goes (subprocess.DEVNULL); ours by default."""
    with serving(command, url + "/v1/models", env, log=log, timeout=STARTUP_TIMEOUT) as process:
        yield Proc(name, url, process)


@contextmanager
def fixed_upstream() -> Iterator[Proc]:
    """nginx answering every POST with one completion: the physical limit."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port = free_port()
    with tempfile.TemporaryDirectory() as root:
        config = Path(root) / "nginx.conf"
        server = FIXED_SERVER.format(port=port, answer=FIXED_ANSWER)
        config.write_text(NGINX_MAIN.format(root=root, servers=server))
        command = [nginx, "-c", str(config), "-p", root]
        with running("nginx", command, f"http://127.0.0.1:{port}") as proc:
            yield proc


@contextmanager
def simulator(token_rate: float) -> Iterator[Proc]:
    port = free_port()
    command = sim_command("openai", port, models="m", ttft=0, token_rate=token_rate)
    with running("sim", command, f"http://127.0.0.1:{port}") as proc:
        yield proc


@contextmanager
def swapgate(upstream: str, env: dict[str, str] | None = None) -> Iterator[Proc]:
    """swapgate in front of one fixed-model upstream: every request on the warm path."""
    config = {
        "routing": {"poll_interval": "5s"},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
    }
    with swapgate_with(config, env) as proc:
        yield proc


@contextmanager
def swapgate_with(
    config: dict[str, Any], env: dict[str, str] | None = None, source: Path | None = None
) -> Iterator[Proc]:
    """swapgate under ``config``; with ``source``, the package in that folder instead of this
    tree's (an earlier commit, exported, to compare with side by side)."""
    port = free_port()
    server = {**config.get("server", {}), "port": port, "access_log": False, "log_level": "warning"}
    config = {**config, "server": server}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(config, handle)
    # -P: the working folder (this tree) not first on the path, so PYTHONPATH's package wins
    python = [sys.executable, "-P"] if source is not None else [sys.executable]
    command = [*python, "-m", "swapgate", "serve", "--config", handle.name]
    path = {"PYTHONPATH": str(source)} if source is not None else {}
    try:
        # Its own state (the activity log's rows among them), gone with it: a benchmark leaves
        # nothing in the user's state folder for the demo's dashboard to list
        with tempfile.TemporaryDirectory(prefix="swapgate-bench-state-") as state:
            own = {"SWAPGATE_STATE_DIR": state, **path, **(env or {})}
            with running("swapgate", command, f"http://127.0.0.1:{port}", own) as proc:
                yield proc
    finally:
        os.unlink(handle.name)


def export(commit: str, into: Path) -> Path:
    """The package at ``commit``, exported into ``into`` (for ``swapgate_with(source=...)``)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


VIEWERS = 5
VIEWER_TOKEN = "bench-dashboard"
BENCH_KEY = "bench-key"  # what the load generators send (bench/load.py)


@contextmanager
def swapgate_keyed(upstream: str) -> Iterator[Proc]:
    """swapgate with a client key that has a scope, a class and both limits (docs/keys.md),
    set high enough never to refuse: what each request pays for the checks."""
    key = {
        "name": "bench",
        "sha256": hashlib.sha256(BENCH_KEY.encode()).hexdigest(),
        "models": ["m*"],
        "priority": "batch",
        "rpm": 100_000_000,
        "concurrency": 100_000,
    }
    config = {
        "routing": {"poll_interval": "5s"},
        "instances": [{"name": "up", "kind": "openai", "url": upstream, "models": ["m"]}],
        "auth": {"keys": [key]},
    }
    with swapgate_with(config) as proc:
        yield proc


@contextmanager
def swapgate_watched(upstream: str) -> Iterator[Proc]:
    """swapgate with ``VIEWERS`` dashboards following ``/admin/events`` the whole time."""
    with swapgate(upstream, {"SWAPGATE_ADMIN_TOKEN": VIEWER_TOKEN}) as proc:
        stop = threading.Event()
        counts = [0] * VIEWERS
        threads = [
            threading.Thread(target=_view, args=(proc.url, stop, counts, i), daemon=True)
            for i in range(VIEWERS)
        ]
        for thread in threads:
            thread.start()
        try:
            yield proc
        finally:
            stop.set()
            for thread in threads:
                thread.join(5)
        if not all(counts):
            raise RuntimeError(f"a viewer got no events: {counts}")


def _view(url: str, stop: threading.Event, counts: list[int], index: int) -> None:
    headers = {"authorization": f"Bearer {VIEWER_TOKEN}"}
    with httpx.stream("GET", f"{url}/admin/events", headers=headers, timeout=30) as events:
        for line in events.iter_lines():
            counts[index] += line.startswith("event: ")
            if stop.is_set():
                return


@contextmanager
def passthrough(upstream: str) -> Iterator[Proc]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.passthrough:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    url = f"http://127.0.0.1:{port}"
    with running("passthrough", command, url, {"UPSTREAM": upstream}) as proc:
        yield proc
