"""A real redis-server on loopback (benchmarks and tests), which can be killed and started again on
its port."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from swapgate.tools.processes import free_port, start, stop

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    def __init__(self, port: int, root: str) -> None:
        self.port, self._root = port, root
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            REDIS,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._root,
        ]
        self.process = start(command, log=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory() as root:
        server = RedisServer(free_port(), root)
        server.start()
        try:
            yield server
        finally:
            if server.process is not None:
                stop(server.process)
