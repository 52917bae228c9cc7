"""The real coding clients through swapgate: Claude Code (``claude -p``) and Codex
(``codex exec``), installed from npm once per machine (testbed/engines.py).

Offline they need only a base URL and a key: ``ANTHROPIC_BASE_URL`` + ``ANTHROPIC_API_KEY``,
and a Codex provider with ``base_url``, ``env_key`` and ``wire_api = "responses"``. Against the
simulator each finishes a turn, warm and through a swap behind a real nginx. A 270M model
cannot do their tool work, so against the real llama-server what is asserted is what the
gateway owes them: every request they send is answered 200 in their own protocol, translated
from chat completions or passed to the engine's own Messages and Responses. There Claude Code
offers two of its tools (``--tools Bash Read``): still real tool definitions, in half its
prompt (~1,900 tokens, not ~3,900, each read by the engine on a CPU core at ~240 a second).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import TURN_ANSWER, CodingClients, ensure_llama_server, tiny_weights
from tests.e2e.nginx import nginx
from tests.e2e.processes import (
    Gateway,
    free_port,
    gateway,
    instance,
    simulator,
    start,
    stop,
    wait_for,
)
from tests.e2e.processes import wait_until_serving as serving
from tests.engine.clis import claude, codex

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def behind_nginx() -> Iterator[tuple[Gateway, str]]:
    """Two models on one simulated llama-swap instance, a 2.5 s swap, nginx giving up after 1 s
    of silence in front, load progress on for every request."""
    with simulator(load_time=2.5) as sim:
        config = {
            "routing": {"min_residency": 0},
            # Progress on: Messages and Responses streams have no place for it, and keep their
            # own keep-alives (docs/operations.md, "Load progress")
            "keepalive": {
                "early_headers_after": "300ms",
                "interval": "300ms",
                "progress": "reasoning",
            },
            "instances": [instance("sim", sim)],
        }
        with gateway(config) as gw, nginx({"swapgate": gw.url}, read_timeout="1s") as front:
            yield gw, front["swapgate"]


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_each_cli_finishes_a_turn_through_a_swap_behind_nginx_and_warm(
    clis: CodingClients, behind_nginx, client: str, tmp_path: Path
) -> None:
    gw, front = behind_nginx
    model = "a" if client == "claude" else "b"
    run = claude if client == "claude" else codex
    swaps = gw.metric("swapgate_swaps_total", result="ok")
    through_swap = run(clis, front, model, tmp_path)
    warm = run(clis, front, model, tmp_path)
    for done in (through_swap, warm):
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Hello from {model}." in done.stdout  # the simulator's words, as the CLI printed
    assert gw.metric("swapgate_swaps_total", result="ok") >= swaps + 1


@pytest.fixture(scope="module")
def real_engine(tmp_path_factory) -> Iterator[str]:
    """llama-server with tools (Jinja), a context for the clients' long prompts (Codex's is
    about 4,500 tokens) and every turn ended after a short answer."""
    engine = tiny_weights(ensure_llama_server())
    port = free_port()
    log = tmp_path_factory.mktemp("clis") / "llama-server.log"
    process = start(engine.with_tools("gemma", port, ctx=16384, max_tokens=48), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        serving(f"{url}/health", process, timeout=60)
        wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=60)  # loaded
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> dict[str, Path]:
    """One home (and working directory) per client for both its runs: its prompt is then the
    same twice, and llama-server's prompt cache spares the second its ~4,000 tokens (~13 s of
    a CPU core)."""
    return {client: tmp_path_factory.mktemp(client) for client in ("claude", "codex")}


@pytest.mark.parametrize(
    "protocols", [["openai"], ["openai", "anthropic", "responses"]], ids=["translated", "native"]
)
@pytest.mark.parametrize("client", ["claude", "codex"])  # each client's runs one after the other
def test_every_request_of_each_cli_is_answered_by_the_real_engine(
    clis: CodingClients, real_engine: str, client: str, protocols: list[str], homes: dict[str, Path]
) -> None:
    config: dict[str, Any] = {
        "instances": [
            {
                "name": "cpu",
                "kind": "openai",
                "url": real_engine,
                "models": ["gemma"],
                "protocols": protocols,
            }
        ],
    }
    endpoint = "messages" if client == "claude" else "responses"
    with gateway(config) as gw:
        if client == "claude":
            done = claude(clis, gw.url, "gemma", homes[client], "--tools", "Bash", "Read")
        else:
            done = codex(clis, gw.url, "gemma", homes[client])
        # A request is counted once the engine's answer has ended; the CLI may exit on the
        # answer's last event, before that (a fresh-clone run under load still saw 0 after 5 s).
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: gw.metric("swapgate_requests_total", model="gemma") >= 1, timeout=30)
        answered = gw.metric("swapgate_requests_total", model="gemma", status="200")
        failed = gw.metric("swapgate_requests_total", model="gemma") - answered
        served = gw.metric("swapgate_endpoint_requests_total", endpoint=endpoint)
        counted = [line for line in gw.metrics().splitlines() if "requests" in line]
    said = done.stdout + done.stderr + "\n".join(counted)
    assert answered >= 1, said
    assert failed == 0, said
    assert served >= 1, said  # through the clients' own API, not a fallback
    assert done.returncode == 0, said
    assert TURN_ANSWER in done.stdout, said  # the engine's words, as the CLI printed them
