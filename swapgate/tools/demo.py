"""``swapgate demo``: a simulator (or a real engine: llama-cpp-python, llama.cpp's own
llama-server in router mode, or llama-swap running llama-server) for every instance of a
config, and the gateway in front."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from swapgate.config.settings import InstanceConfig, KvKeepConfig, Settings
from swapgate.server.serve import serve
from swapgate.tools.admin_cli import demo_token_path
from swapgate.tools.processes import serving, sim_command

FLAVOURS = {"llama-swap": "llama-swap", "ollama": "ollama", "openai": "openai"}
ENGINE_STARTUP = 60.0  # the server loads its first model before it listens
DEFAULT_N_CTX = 2048


def run_demo(
    settings: Settings,
    load_time: float,
    config_path: str | None = None,
    engine: str | None = None,
) -> int:
    """Serve the gateway in front of a simulator per instance, or, with ``engine``, a real
    server per instance: llama-cpp-python (``llama.cpp``) or a llama-server router
    (``llama-server``), each built once per machine (testbed/engines.py)."""
    with ExitStack() as stack:
        stack.enter_context(_terminate_unwinds())
        token = stack.enter_context(demo_admin_token(settings))
        if engine == "llama-swap":
            settings = keeping_kv(settings, stack.enter_context(_scratch()))
        for instance in settings.instances:
            if engine is None:
                stack.enter_context(simulator(instance, load_time))
            elif engine == "llama-server":
                stack.enter_context(llama_router(instance))
            elif engine == "llama-swap":
                stack.enter_context(llama_swap(instance, stack.enter_context(_scratch())))
            else:
                stack.enter_context(llama_cpp_server(instance))
        print(_instructions(settings, load_time, engine, token), flush=True)
        serve(settings, config_path=config_path)
    return 0


@contextmanager
def llama_cpp_server(instance: InstanceConfig) -> Iterator[None]:
    """A real llama-cpp-python server where the instance's URL points, serving Gemma-3-270M
    under each of the instance's model names (the second and later with twice the context,
    so that each is a model of its own to the server)."""
    from testbed.engines import ensure_llama_cpp

    engine = ensure_llama_cpp()
    models = {m: DEFAULT_N_CTX * (2 if i else 1) for i, m in enumerate(instance.models or ("a",))}
    port = urlsplit(instance.url).port or 80
    with tempfile.TemporaryDirectory(prefix="swapgate-demo-") as root:
        command = engine.write_config(Path(root) / "llama.json", port, models)
        url = instance.url + "/v1/models"
        log = subprocess.DEVNULL
        with serving(command, url, engine.env(), log=log, clean_env=True, timeout=ENGINE_STARTUP):
            yield


@contextmanager
def llama_router(instance: InstanceConfig) -> Iterator[None]:
    """A llama-server router where the instance's URL points, serving Gemma-3-270M under each
    of the instance's model names, one loaded at a time."""
    from testbed.engines import ensure_llama_server

    engine = ensure_llama_server()
    models = {m: DEFAULT_N_CTX * (2 if i else 1) for i, m in enumerate(instance.models or ("a",))}
    port = urlsplit(instance.url).port or 80
    with tempfile.TemporaryDirectory(prefix="swapgate-demo-") as root:
        preset = engine.write_preset(Path(root) / "models.ini", models)
        command = engine.router(preset, port, max_models=1)
        log = subprocess.DEVNULL
        with serving(command, instance.url + "/models", log=log, timeout=ENGINE_STARTUP):
            yield


@contextmanager
def llama_swap(instance: InstanceConfig, root: Path) -> Iterator[None]:
    """A real llama-swap where the instance's URL points, running llama-server with
    Gemma-3-270M for each of the instance's model names, one loaded at a time."""
    from testbed.engines import ensure_llama_swap

    engine = ensure_llama_swap()
    if engine is None:
        raise SystemExit(
            "ENGINE=llama-swap needs llama-swap: the project's shared/engines/llama-swap beside "
            "this checkout, or SWAPGATE_LLAMA_SWAP=/path/to/llama-swap"
        )
    models = dict.fromkeys(instance.models or ("a",), DEFAULT_N_CTX)
    port = urlsplit(instance.url).port or 80
    flags: tuple[str, ...] = ()
    if instance.kv_folder is not None:  # its conversations survive its swaps (kv_keep)
        instance.kv_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = ("--swa-full", "--slot-save-path", str(instance.kv_folder))
    config = engine.write_config(root / f"llama-swap-{port}.yaml", models, flags=flags)
    log = subprocess.DEVNULL
    with serving(engine.command(config, port), instance.url + "/health", log=log):
        yield


def keeping_kv(settings: Settings, root: Path) -> Settings:
    """``settings`` with ``kv_keep`` on every llama-swap instance that has none, its folder
    under ``root``: the demo's conversations survive their swaps (docs/kv-keep.md)."""
    instances = [
        inst.model_copy(update={"kv_keep": KvKeepConfig(dir=str(root / inst.name))})
        if inst.kind == "llama-swap" and inst.kv_keep is None
        else inst
        for inst in settings.instances
    ]
    return settings.model_copy(update={"instances": instances})


@contextmanager
def _terminate_unwinds() -> Iterator[None]:
    """SIGTERM (``kill``, ``docker stop``, a service manager) ends the demo as Ctrl-C does: its
    engines and simulators are stopped, its token and temporary folders removed, and it exits
    with 143. uvicorn shuts the gateway down on SIGTERM and then raises the signal again; with
    Python's default action the process died there, before any of that."""

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="swapgate-demo-") as root:
        yield Path(root)


@contextmanager
def demo_admin_token(settings: Settings) -> Iterator[str]:
    """The admin API on, for the demo: the operator's own token if its variable is set, else
    one made for this run. It is written (0600) where ``swapgate status``, ``jobs`` and
    ``preload`` look for a demo's token, so that they work in the demo with no flag; they
    ignore it once the demo's process is gone."""
    variable = settings.server.admin_token_env
    token = os.environ.get(variable) or secrets.token_urlsafe(16)
    os.environ[variable] = token  # the gateway below reads it as it starts
    url = f"http://{settings.server.host}:{settings.server.port}"
    path = demo_token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(json.dumps({"url": url, "token": token, "pid": os.getpid()}))
    try:
        yield token
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def simulator(instance: InstanceConfig, load_time: float) -> Iterator[None]:
    """Run ``swapgate sim`` where the instance's URL points, until the block ends."""
    address = urlsplit(instance.url)
    command = sim_command(
        FLAVOURS.get(instance.kind, "openai"),
        address.port or 80,
        host=address.hostname or "127.0.0.1",
        models=",".join(instance.models or ("a", "b", "c")),
        capacity=instance.capacity,
        load_time=load_time,
    )
    with serving(command, instance.url + "/v1/models"):
        yield


def _instructions(
    settings: Settings, load_time: float, engine: str | None = None, token: str = ""
) -> str:
    base = f"http://{settings.server.host}:{settings.server.port}"
    models = sorted({m for i in settings.instances for m in i.models or ()})
    first = models[0] if models else "a"
    chat = (
        f"curl -sS -D - {base}/v1/chat/completions -H 'content-type: application/json' "
        f"""-d '{{"model": "{first}", "max_tokens": 32, "messages": """
        f"""[{{"role": "user", "content": "hi"}}]}}'"""
    )
    names = ", ".join(f"{i.name} ({i.url})" for i in settings.instances)
    what = (
        f"real {engine} servers {names} (Gemma-3-270M on the CPU); a load takes 1–2 s"
        if engine
        else f"simulated instances {names}; each load takes {load_time:g}s"
    )
    keeps = any(i.kv_keep is not None for i in settings.instances)
    kept = ", and conversations kept across swaps (kv_keep)" if keeps else ""
    kv = "|kv_saves_total|kv_restores_total" if keeps else ""
    return f"""
swapgate demo: {what}.

  The dashboard: {base}/ui (sign in with the admin token {token})

  # every model and where it is warm
  curl -sS {base}/v1/models

  # a swap: the first request for {first} waits for its load (see x-swapgate-wait-ms)
  {chat}

  # a warm hit: the same request again answers at once
  {chat}

  # a streamed answer
  curl -sSN {base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "{first}", "max_tokens": 32, "stream": true,
         "messages": [{{"role": "user", "content": "hi"}}]}}'

  # swap durations and warm state{kept}
  curl -sS {base}/metrics | grep -E 'swapgate_(swap_duration_seconds_count|model_warm{kv})'

  # the admin API (token {token}): what is warm where, and a preload
  swapgate status
  swapgate preload {first}
  curl -sS {base}/admin/state -H 'authorization: Bearer {token}'

Ctrl-C stops the gateway and the simulators.
"""
