"""The contract users read, ``/openapi.json``, against the running gateway: schemathesis (an
API fuzzer) sends what the document says is valid and what it says is not, and checks every
answer's status, headers and body against the document (docs/compatibility.md, "The contract")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e
TOKEN = "contract-admin"
ST = str(Path(sys.executable).with_name("st"))
# An endless event stream; schemathesis would wait on it to the end of its timeout
EVENTS = "/admin/events"
UPLOAD = "/v1/audio/transcriptions"


def fuzz(url: str, where: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``st run`` from ``where``, which gets its cache of failures (.schemathesis/)."""
    command = [ST, "run", f"{url}/openapi.json", "-H", f"Authorization: Bearer {TOKEN}"]
    command += ["--max-examples", "15", "--seed", "7", "--checks", "all", *options]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=240, check=False, cwd=where
    )


def test_schemathesis_finds_nothing_the_document_does_not_say(tmp_path: Path) -> None:
    config = {
        "server": {"admin_token_env": "CONTRACT_TOKEN"},
        "models": {"chat": {"aliases": ["assistant"]}},
        "preloads": [{"name": "morning", "model": "chat", "cron": "0 7 * * *"}],
        "capture": {"models": ["chat"]},
    }
    with simulator() as one, simulator() as two:
        config["instances"] = [
            instance("gpu-1", one, models=["chat", "code"]),
            instance("gpu-2", two, models=["chat", "code"]),
        ]
        with gateway(config, env={"CONTRACT_TOKEN": TOKEN}) as gw:
            document = httpx.get(f"{gw.url}/openapi.json", timeout=10).json()
            everything = fuzz(gw.url, tmp_path, "--exclude-path", EVENTS, "--exclude-path", UPLOAD)
            # A form's model must come before its file (the file streams through); OpenAPI
            # cannot say in which order a form's fields come, so a valid form may be refused
            upload = fuzz(
                gw.url,
                tmp_path,
                "--include-path",
                UPLOAD,
                "--exclude-checks",
                "positive_data_acceptance",
            )
    for run in (everything, upload):
        assert run.returncode == 0, run.stdout[-6000:]
        assert " passed" in run.stdout
    paths = document["paths"]
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses"} <= set(paths)
    chat = paths["/v1/chat/completions"]["post"]
    assert {"200", "400", "404", "429", "503"} <= set(chat["responses"])
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    usage = paths["/admin/usage"]["get"]["parameters"]
    by = next(p for p in usage if p["name"] == "by")
    assert by["schema"]["enum"] == ["key", "model"]
    assert not any("422" in op["responses"] for item in paths.values() for op in item.values())
