"""A real nginx on loopback, with a config written for the test."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from bench.procs import NGINX_MAIN
from swapgate.drivers.children import die_with_parent
from tests.e2e.processes import free_port, wait_until_serving

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

SERVER = """
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://{upstream};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout {read_timeout};
    }}
  }}
"""

MAIN = NGINX_MAIN


POOL = """
  upstream {name} {{
{servers}
  }}
"""


@contextmanager
def nginx(
    upstreams: Mapping[str, str | list[str]], read_timeout: str = "2s"
) -> Iterator[dict[str, str]]:
    """Start nginx with one server per upstream (``name -> http://host:port``, or a list of
    them that nginx balances round-robin); yield the front URL of each."""
    if not Path(NGINX).exists():
        raise RuntimeError("nginx is not installed: apt-get install nginx-light (.ci/run does)")
    ports = {name: free_port() for name in upstreams}
    servers = ""
    for name, target in upstreams.items():
        upstream = target.removeprefix("http://") if isinstance(target, str) else name
        if isinstance(target, list):
            members = "".join(f"    server {url.removeprefix('http://')};\n" for url in target)
            servers += POOL.format(name=name, servers=members.rstrip())
        servers += SERVER.format(port=ports[name], upstream=upstream, read_timeout=read_timeout)
    with tempfile.TemporaryDirectory() as root:
        config = Path(root) / "nginx.conf"
        config.write_text(MAIN.format(root=root, servers=servers))
        process = subprocess.Popen(
            [NGINX, "-c", str(config), "-p", root], preexec_fn=die_with_parent
        )
        fronts = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        try:
            for url in fronts.values():
                wait_until_serving(f"{url}/v1/models", process)
            yield fronts
        finally:
            process.terminate()
            process.wait(timeout=10)
