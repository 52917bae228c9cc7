"""LiteLLM's proxy as a contender, installed into its own venv when asked for."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import yaml

from bench import procs
from swapgate.tools.processes import free_port

VENV = Path(__file__).resolve().parent / ".litellm-venv"


def contender(notes: list[str]) -> Callable[[str], AbstractContextManager[procs.Proc]] | None:
    binary = VENV / "bin" / "litellm"
    if not binary.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            subprocess.run(
                [str(VENV / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"],
                check=True,
                timeout=900,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            notes.append(f"LiteLLM skipped: installing litellm[proxy] failed ({exc})")
            return None
    probe = "import importlib.metadata as m; print(m.version('litellm'))"
    version = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", probe], capture_output=True, text=True
    ).stdout.strip()
    notes.append(f"LiteLLM {version} proxy, one worker, `openai/m` pointed at the same upstream.")

    @contextmanager
    def start(upstream: str) -> Iterator[procs.Proc]:
        port = free_port()
        params = {"model": "openai/m", "api_base": f"{upstream}/v1", "api_key": "x"}
        config = {
            "model_list": [{"model_name": "m", "litellm_params": params}],
            "litellm_settings": {"drop_params": True, "set_verbose": False},
        }
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
            yaml.safe_dump(config, handle)
        command = [str(binary), "--config", handle.name, "--port", str(port), "--num_workers", "1"]
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the internet
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # loopback only
        }
        with procs.running("litellm", command, f"http://127.0.0.1:{port}", env) as proc:
            yield proc

    return start
