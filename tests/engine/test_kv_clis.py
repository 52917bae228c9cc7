"""Claude Code and Codex sessions through swapgate in front of a real llama-server with
``kv_keep`` (docs/kv-keep.md): three turns, a swap away and back between the second and the
third. From the second turn on, the engine reads only what each turn added (its own
``llamacpp:prompt_tokens_total``), the turn after the swap included: three Claude Code sessions
at once, each in its own folder, and a Codex session (Responses: ``instructions`` and input
items, translated to chat completions for the engine).
"""

from __future__ import annotations

import concurrent.futures
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import (
    TURN_ANSWER,
    CodingClients,
    LlamaServerEngine,
    ensure_llama_server,
    tiny_weights,
)
from testbed.served import engine_url, prompt_tokens_read
from tests.e2e.processes import Gateway, gateway
from tests.engine.clis import claude, codex
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine


def node(engine: LlamaServerEngine, kv: Path, slots: int) -> dict[str, Any]:
    """Two models on one process instance, their servers as coding clients need them (tools,
    a long context), each turn ended after a short answer."""
    flags = ["--swa-full", "--metrics", "-np", str(slots)]
    commands = {
        name: {
            "cmd": " ".join([*engine.with_tools(name, "${PORT}", 16384, 48), *flags]),
            "ready": "/health",
        }
        for name in ("a", "b")
    }
    return process_node(commands, kv_keep={"dir": str(kv), "budget": "2GiB"})


def swap_away(gw: Gateway) -> None:
    body = {"model": "b", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
    httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=240).raise_for_status()


def read_per_turn(gw: Gateway, turns: list[Any]) -> list[int]:
    """The prompt tokens model a's engine read for each of ``turns`` (callables), with a swap
    away and back before the last (its server then starts counting from 0)."""
    read, before = [], 0
    for number, turn in enumerate(turns):
        if number == len(turns) - 1:
            swap_away(gw)
            before = 0
        turn()
        total = prompt_tokens_read(engine_url(gw.process.pid, "a"))
        read.append(total - before)
        before = total
    return read


def finished(done: subprocess.CompletedProcess[str]) -> None:
    """The client's turn ended with the engine's answer (``TURN_ANSWER``), and it said so."""
    assert done.returncode == 0, done.stdout + done.stderr
    assert TURN_ANSWER in done.stdout, done.stdout + done.stderr


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def test_three_claude_code_sessions_at_once_read_only_what_each_turn_adds(
    engine: LlamaServerEngine, clis: CodingClients, tmp_path: Path
) -> None:
    homes = [tmp_path / name for name in ("alpha", "beta", "gamma")]
    for home in homes:
        home.mkdir()

    def turn(number: int) -> Any:
        def run_all() -> None:
            more = ("-c",) if number > 1 else ()
            with concurrent.futures.ThreadPoolExecutor(len(homes)) as pool:
                runs = [
                    pool.submit(
                        claude,
                        clis,
                        gw.url,
                        "a",
                        home,
                        "--tools",
                        "Bash",
                        "Read",
                        *more,
                        prompt=f"Turn {number}: say hi to {home.name}.",
                    )
                    for home in homes
                ]
                for run in runs:
                    finished(run.result())

        return run_all

    with gateway(node(engine, tmp_path / "kv", slots=4)) as gw:
        read = read_per_turn(gw, [turn(1), turn(2), turn(3)])
        restores = gw.metric("swapgate_kv_restores_total", result="ok")
    print(
        f"\nthree Claude Code sessions: prompt tokens read per turn {read}, {restores:.0f} restored"
    )
    assert read[0] > 3 * 1000, "turn 1: each session's whole prompt"
    assert read[1] < read[0] * 0.15, f"turn 2 read only what it added: {read}"
    assert restores >= 3
    assert read[2] < read[0] * 0.15, f"turn 3, after the swap, too: {read}"


def test_a_codex_session_reads_only_what_each_turn_adds(
    engine: LlamaServerEngine, clis: CodingClients, tmp_path: Path
) -> None:
    home = tmp_path / "codex"
    home.mkdir()

    def turn(number: int) -> Any:
        return lambda: finished(
            codex(clis, gw.url, "a", home, f"Turn {number}: say hi.", resume=number > 1)
        )

    with gateway(node(engine, tmp_path / "kv", slots=2)) as gw:
        read = read_per_turn(gw, [turn(1), turn(2), turn(3)])
        restores = gw.metric("swapgate_kv_restores_total", result="ok")
    print(f"\nCodex: prompt tokens read per turn {read}, {restores:.0f} restored")
    assert read[0] > 2000, "turn 1: its whole prompt"
    assert read[1] < read[0] * 0.15, f"turn 2 read only what it added: {read}"
    assert restores >= 1
    assert read[2] < read[0] * 0.15, f"turn 3, after the swap, too: {read}"
