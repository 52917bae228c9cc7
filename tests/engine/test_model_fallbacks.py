"""A context fallback between two real llama-server models (docs/configuration.md, "Fallback
models"): ``short`` runs with ``-c 256``; a prompt longer than that goes to ``long`` (``-c
4096``), which answers it, while a short prompt stays with ``short``. The same long prompt sent
to ``short``'s own engine is refused: the fallback is what makes it answered. A prompt the
estimate lets through (digits: a token each) goes to ``long`` once ``short``'s engine refuses it."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import httpx
import psutil
import pytest

from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import free_port, gateway

pytestmark = pytest.mark.engine
KEY = "fallback-engine-key"
AUTH = {"authorization": f"Bearer {KEY}"}
# About 700 tokens by Gemma's tokenizer; about 800 by swapgate's estimate (characters / 4)
LONG = " ".join(
    f"The river number {n} runs past the old mill and the quiet town." for n in range(50)
)

# Past -c 256 by Gemma's tokenizer (a token per digit: about 1,200), within 1.25 x 256 by
# swapgate's estimate (characters / 4: 300): only the engine can tell it is too long
DIGITS = " ".join(str(n) for n in range(100, 400))


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def _config(engine: LlamaServerEngine) -> dict[str, Any]:
    def command(alias: str, ctx: int) -> dict[str, str]:
        return {"cmd": " ".join(engine.single(alias, "${PORT}", ctx=ctx)), "ready": "/health"}

    return {
        "routing": {"min_residency": 0, "poll_interval": "500ms"},
        "auth": {"keys": [{"name": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]},
        "instances": [
            {
                "name": "node",
                "kind": "process",
                "capacity": 2,
                "start_port": free_port(),
                "commands": {"short": command("short", 256), "long": command("long", 4096)},
            }
        ],
        "models": {"short": {"context": 256, "fallbacks": ["long"]}},
    }


def _chat(url: str, model: str, text: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def test_a_prompt_longer_than_the_context_is_answered_by_the_longer_model(
    engine: LlamaServerEngine,
) -> None:
    with gateway(_config(engine)) as gw:
        short = _chat(gw.url, "short", "Say hello.")
        assert short.status_code == 200, short.text
        assert "x-swapgate-model" not in short.headers
        assert short.json()["model"] == "short"

        long = _chat(gw.url, "short", LONG)
        assert long.status_code == 200, long.text
        assert long.headers["x-swapgate-model"] == "long"
        assert long.json()["model"] == "long"
        assert long.json()["usage"]["prompt_tokens"] > 256, "the engine's count: past -c 256"
        counted = gw.metric(
            "swapgate_model_fallbacks_total", model="short", to="long", reason="context"
        )
        assert counted == 1

        # short's own engine, still running (capacity 2), refuses the same prompt
        port = _engine_port(gw.process.pid, "short")
        assert _direct(port, "Say hello.") == 200
        assert _direct(port, LONG) == 400


def test_a_prompt_the_estimate_let_through_goes_to_the_longer_model_once_the_engine_refuses_it(
    engine: LlamaServerEngine,
) -> None:
    assert math.ceil(len(DIGITS) / 4) <= 256 * 1.25, "the estimate alone would not send it"
    with gateway(_config(engine)) as gw:
        for model in ("short", "long"):  # both warm (capacity 2): no early headers go out
            assert _chat(gw.url, model, "Say hello.").status_code == 200
        for stream in (False, True):
            messages = [{"role": "user", "content": DIGITS}]
            body: dict[str, Any] = {"model": "short", "messages": messages, "max_tokens": 4}
            body["stream"] = stream
            answer = httpx.post(
                f"{gw.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-swapgate-model"] == "long"
            if not stream:
                assert answer.json()["usage"]["prompt_tokens"] > 256
            else:
                assert '"model":"long"' in answer.text.replace(" ", "")
        counted = gw.metric(
            "swapgate_model_fallbacks_total", model="short", to="long", reason="context"
        )
        assert counted == 2
        # A model without fallbacks gets its engine's refusal as the engine sent it
        refused = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "long", "messages": [{"role": "user", "content": "hi"}], "n": -3},
            headers=AUTH,
            timeout=60,
        )
        assert refused.status_code == 400
        assert "x-swapgate-model" not in refused.headers


def _engine_port(pid: int, alias: str) -> int:
    """The port the gateway's llama-server for ``alias`` listens on."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            words = child.cmdline()
            if "--alias" not in words or words[words.index("--alias") + 1] != alias:
                continue
            for conn in child.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    return int(conn.laddr.port)
        except psutil.Error:
            continue
    raise AssertionError(f"no llama-server for {alias} under the gateway")


def _direct(port: int, text: str) -> int:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
    return answer.status_code
