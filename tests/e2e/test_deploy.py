"""The shipped reverse-proxy files, loaded into a real nginx and a real Caddy in front of swapgate:
tokens reach a raw client while the upstream is still generating."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from swapgate.drivers.children import die_with_parent
from tests.e2e import wire
from tests.e2e.nginx import MAIN, NGINX
from tests.e2e.processes import (
    Gateway,
    free_port,
    gateway,
    instance,
    simulator,
    wait_until_serving,
)

pytestmark = pytest.mark.e2e
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CADDY = shutil.which("caddy") or "/usr/bin/caddy"
TOKENS, RATE = 10, 5.0  # two seconds of generation


@pytest.fixture(scope="module")
def gw() -> Iterator[Gateway]:
    with (
        simulator(models=("a",), load_time=0.1, token_rate=RATE) as sim,
        gateway({"instances": [instance("gpu-a", sim)]}) as gateway_process,
    ):
        yield gateway_process


def _assert_streams_unbuffered(front: str) -> None:
    body = {"model": "a", "messages": [], "stream": True, "max_tokens": TOKENS}
    response = wire.post(front, "/v1/chat/completions", body)
    assert response.status == 200
    assert response.first_event_after is not None
    last = response.chunk_times[-1]
    assert last > TOKENS / RATE * 0.8, "the whole answer took the generation's time"
    assert response.first_event_after < last - 1.0, "the first token came long before the end"
    assert response.data_lines()[-1] == "data: [DONE]"


def test_the_nginx_snippet_streams_unbuffered(gw, tmp_path) -> None:
    port = free_port()
    snippet = (DEPLOY / "nginx" / "swapgate.conf").read_text()
    snippet = snippet.replace("server 127.0.0.1:8080;", f"server {gw.url.removeprefix('http://')};")
    snippet = snippet.replace("listen 80;", f"listen 127.0.0.1:{port};")
    config = tmp_path / "nginx.conf"
    config.write_text(MAIN.format(root=tmp_path, servers=snippet))
    _assert_proxy_streams_unbuffered([NGINX, "-c", str(config), "-p", str(tmp_path)], port)


@contextmanager
def _caddy_home() -> Iterator[dict[str, str]]:
    with tempfile.TemporaryDirectory() as home:
        yield {**os.environ, "HOME": home, "XDG_DATA_HOME": home, "XDG_CONFIG_HOME": home}


def test_the_caddyfile_is_valid_caddy() -> None:
    with _caddy_home() as env:
        caddyfile = str(DEPLOY / "caddy" / "Caddyfile")
        command = [CADDY, "validate", "--config", caddyfile, "--adapter", "caddyfile"]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Valid configuration" in result.stderr + result.stdout


def test_the_caddyfile_streams_unbuffered(gw, tmp_path) -> None:
    port = free_port()
    caddyfile = (DEPLOY / "caddy" / "Caddyfile").read_text()
    caddyfile = caddyfile.replace(
        "llm.example.com {", f"{{\n\tadmin off\n}}\n\nhttp://127.0.0.1:{port} {{"
    )
    caddyfile = caddyfile.replace(
        "reverse_proxy 127.0.0.1:8080", f"reverse_proxy {gw.url.removeprefix('http://')}"
    )
    config = tmp_path / "Caddyfile"
    config.write_text(caddyfile)
    with _caddy_home() as env:
        command = [CADDY, "run", "--config", str(config), "--adapter", "caddyfile"]
        _assert_proxy_streams_unbuffered(command, port, env)


def _assert_proxy_streams_unbuffered(
    command: list[str], port: int, env: dict[str, str] | None = None
) -> None:
    process = subprocess.Popen(
        command, env=env, preexec_fn=die_with_parent, stderr=subprocess.DEVNULL
    )
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/healthz", process)
        _assert_streams_unbuffered(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=10)
