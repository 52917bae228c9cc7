"""The suite's gateways are forked from a zygote (tests/e2e/zygote.py): what the tests see of
such a child must be what they would see of ``python -m swapgate``."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from swapgate import __version__
from swapgate.tools.processes import free_port, start, wait_until_serving
from tests.e2e.zygote import ZYGOTE


def test_a_forked_command_writes_its_output_where_asked_and_exits_as_python_would(
    tmp_path: Path,
) -> None:
    log = tmp_path / "version.log"
    assert ZYGOTE.fork(["--version"], {}, log).wait(timeout=10) == 0
    assert log.read_text().strip() == f"swapgate {__version__}"
    missing = str(tmp_path / "missing.yaml")
    forked = ZYGOTE.fork(["check-config", missing], {}, tmp_path / "forked.log").wait(10)
    fresh = start([sys.executable, "-m", "swapgate", "check-config", missing], {})
    assert forked == fresh.wait(timeout=30) != 0
    assert missing in (tmp_path / "forked.log").read_text()


def test_a_forked_command_reads_the_environment_it_was_given(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "status.log"
    assert ZYGOTE.fork(["status"], {"SWAPGATE_URL": url}, log).wait(timeout=10) == 1
    assert f"cannot reach swapgate at {url}" in log.read_text()


def test_a_forked_server_ends_by_its_signal(tmp_path: Path) -> None:
    port = free_port()
    args = ["sim", "--flavor", "llama-swap", "--port", str(port), "--models", "a"]
    server = ZYGOTE.fork(args, {}, tmp_path / "sim.log")
    wait_until_serving(f"http://127.0.0.1:{port}/v1/models", server)
    assert server.poll() is None
    server.kill()
    assert server.wait(timeout=10) == -signal.SIGKILL
    assert server.poll() == -signal.SIGKILL
