"""Running the real coding clients, Claude Code (``claude -p``) and Codex (``codex exec``),
installed from npm once per machine (testbed/engines.py), against a base URL."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed.engines import CodingClients

QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48",  # else it asks for 32,000 tokens
}


def claude(
    clis: CodingClients,
    url: str,
    model: str,
    home: Path,
    *options: str,
    prompt: str = "Say hi.",
) -> subprocess.CompletedProcess[str]:
    """One turn; ``home`` is its home and working folder (``-c`` in ``options``: the next
    turn of the session last run there)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "local",
        **QUIET,
    }
    command = [str(clis.claude), "-p", prompt, "--model", model, *options]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=240)


def codex(
    clis: CodingClients,
    url: str,
    model: str,
    home: Path,
    prompt: str = "Say hi.",
    resume: bool = False,
) -> subprocess.CompletedProcess[str]:
    """One turn of ``codex exec`` (``resume``: the next turn of the last session in ``home``)."""
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "swapgate"\n\n[model_providers.swapgate]\n'
        f'name = "swapgate"\nbase_url = "{url}/v1"\nenv_key = "SWAPGATE_KEY"\n'
        'wire_api = "responses"\n'
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "SWAPGATE_KEY": "local",
    }
    command = [str(clis.codex), "exec", "--skip-git-repo-check"]
    command += ["resume", "--last", prompt] if resume else [prompt]
    return subprocess.run(
        command,
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
