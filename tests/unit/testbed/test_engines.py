"""The test engines' builds (testbed/engines.py): portable flags, never the native
target; flags in the cache key, so an engine built with others is rebuilt; and the smoke check
that stops at an engine that cannot answer, naming how it ended."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

import testbed.__main__ as make_engine
from swapgate.drivers.children import exit_name
from testbed import engines
from testbed.cache import CACHE_ENV
from testbed.engines import EngineBroken, flags_key, portable_flags, smoke_server


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_engine_builds_never_take_the_native_target(machine: str) -> None:
    flags = portable_flags(machine)
    assert "-DGGML_NATIVE=OFF" in flags
    assert not any("native" in flag.lower() and flag != "-DGGML_NATIVE=OFF" for flag in flags)
    if machine == "x86_64":
        assert "-DGGML_AVX2=ON" in flags
        for held_back in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
            assert f"-DGGML_{held_back}=OFF" in flags


def test_llama_cpp_python_is_compiled_with_the_portable_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pip builds llama-cpp-python from its sdist with CMAKE_ARGS: never a cached wheel."""
    ran: list[tuple[list[str], dict[str, str] | None]] = []
    monkeypatch.setattr(engines, "run", lambda command, env=None: ran.append((command, env)))
    engine = engines.LlamaCppEngine(tmp_path / "bin" / "python", tmp_path / "gemma.gguf")
    engines._build(tmp_path, engine, portable_flags("x86_64"))
    install = next((cmd, env) for cmd, env in ran if "install" in cmd)
    command, env = install
    assert env is not None
    assert env["CMAKE_ARGS"].split() == list(portable_flags("x86_64"))
    assert "--no-binary" in command
    assert "--no-cache-dir" in command


def test_llama_server_is_configured_with_the_portable_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(engines, "run", lambda command, env=None: ran.append(command))
    engines.build_llama_server(tmp_path / "src", tmp_path / "build", *portable_flags("x86_64"))
    configure = ran[0]
    assert configure[0] == "cmake"
    assert "-DGGML_NATIVE=OFF" in configure
    assert configure.index("-DGGML_NATIVE=OFF") > configure.index("-DCMAKE_BUILD_TYPE=Release")


def test_a_cached_engine_built_with_other_flags_is_rebuilt_not_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(engines, "_checked", lambda *args, **kwargs: None)
    # An engine built the old way (no flags in its key) and one built with other flags
    old = tmp_path / f"engine-llama-server-{engines.LLAMA_SERVER_VERSION}"
    other = tmp_path / f"engine-llama-server-{engines.LLAMA_SERVER_VERSION}-{flags_key(['x'])}"
    for root in (old, other):
        (root / "bin").mkdir(parents=True)
        (root / ".ready").write_text("built\n")
    built: list[Path] = []

    def build(root: Path, engine: engines.LlamaServerEngine, flags: tuple[str, ...]) -> None:
        built.append(root)
        root.mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(engines, "_build_llama_server", build)
    engine = engines.ensure_llama_server(say=False)
    root = engine.binary.parent.parent
    assert built == [root]
    assert root not in (old, other)
    assert flags_key(portable_flags()) in root.name
    record = json.loads((root / "build-flags.json").read_text())
    assert record["flags"] == list(portable_flags())
    assert not old.exists()  # never used again: gone
    assert not other.exists()
    engines.ensure_llama_server(say=False)
    assert built == [root]  # built once: reused from now on


def _stand_in(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "llama-server"
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [str(script)]


def test_the_smoke_check_names_the_signal_the_last_lines_and_what_to_try(tmp_path: Path) -> None:
    crash = (
        "import os, signal, sys\n"
        "print('llama_model_loader: loaded meta data with 40 key-value pairs', flush=True)\n"
        "print('llama threadpool init, n_threads = 2', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    with pytest.raises(EngineBroken) as raised:
        smoke_server(
            "llama-server (stand-in)",
            _stand_in(tmp_path, crash),
            9,
            model="smoke",
            ready="/health",
            env=dict(os.environ),
            timeout=20,
            hint="What to try: make engine",
        )
    message = str(raised.value)
    assert "llama-server (stand-in) cannot answer on this machine" in message
    assert "exited with SIGSEGV while starting" in message
    assert "llama threadpool init, n_threads = 2" in message
    assert "What to try: make engine" in message


def test_make_engine_stops_with_the_message_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(say: bool = True) -> engines.LlamaServerEngine:
        raise EngineBroken("llama-server cannot answer on this machine: it exited with SIGILL")

    monkeypatch.setattr(make_engine, "ensure_llama_server", broken)
    with pytest.raises(SystemExit) as raised:
        make_engine.main(["llama-server"])
    assert str(raised.value) == (
        "error: llama-server cannot answer on this machine: it exited with SIGILL"
    )


@pytest.mark.parametrize(
    ("code", "named"),
    [
        (-signal.SIGSEGV, "SIGSEGV"),
        (-4, "SIGILL"),
        (139, "SIGSEGV (exit code 139)"),
        (1, "exit code 1"),
        (200, "exit code 200"),
    ],
)
def test_exits_are_named_by_signal(code: int, named: str) -> None:
    assert exit_name(code) == named


def test_the_cpu_fingerprint_is_stable_and_short() -> None:
    assert engines.cpu_fingerprint() == engines.cpu_fingerprint()
    assert len(engines.cpu_fingerprint()) == 10
