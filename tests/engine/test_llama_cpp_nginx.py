"""The timeout wall with a real load: nginx (proxy_read_timeout 600ms) in front of
llama-cpp-python, whose swap from one alias to the other takes 1–2 s here.

Straight through nginx the client gets 504 although the engine loads the model; through swapgate
the keep-alives keep nginx reading, and the bytes after them are the engine's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from testbed.engines import LlamaCppEngine
from tests.e2e.nginx import nginx
from tests.e2e.processes import gateway
from tests.e2e.wire import post
from tests.engine.conftest import llama_server, swap_on_request

pytestmark = pytest.mark.engine
MODELS = {"gemma-a": 2048, "gemma-b": 4096}  # the server loads gemma-a as it starts
READ_TIMEOUT = 0.6
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def fronts(gemma: LlamaCppEngine, tmp_path_factory) -> Iterator[dict[str, str]]:
    # Gemma itself: its load takes longer than nginx's read timeout, the tiny Llama's may not
    engine = gemma
    root = tmp_path_factory.mktemp("llama-nginx")
    with llama_server(engine, root, MODELS) as direct, llama_server(engine, root, MODELS) as behind:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "150ms", "interval": "200ms"},
            "instances": [swap_on_request("llama", behind, list(MODELS))],
        }
        upstreams = {"direct": direct.url, "swapgate": ""}
        with gateway(config) as gw:
            upstreams["swapgate"] = gw.url
            with nginx(upstreams, read_timeout=f"{round(READ_TIMEOUT * 1000)}ms") as urls:
                yield urls


def test_straight_through_nginx_a_real_load_times_out(fronts) -> None:
    client = openai.OpenAI(base_url=f"{fronts['direct']}/v1", api_key="x", max_retries=0)
    with client, pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="gemma-b", **CHAT)  # type: ignore[call-overload]
    assert failed.value.status_code == 504


def test_through_swapgate_the_keepalives_then_the_engines_own_stream(fronts) -> None:
    # One token: after the engine's first byte nothing is swapgate's to keep alive, and on a
    # busy machine a gap between two of Gemma's tokens outlasted nginx's 600 ms (CI cut the
    # stream once so). One token leaves no such gap: what is tested is the wait before it.
    ask = {**CHAT, "max_tokens": 1}
    response = post(
        fronts["swapgate"], "/v1/chat/completions", {"model": "gemma-b", "stream": True, **ask}
    )
    assert response.status == 200
    lines = [line for line in response.lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    assert comments
    assert comments[0].startswith(": swapgate loading gemma-b on llama")
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert all(line.startswith(":") for line in lines[:first_data])
    assert lines[-1].startswith(": swapgate waited ")  # the whole wait, after the engine's end
    engine_lines = lines[first_data:-1]
    assert engine_lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in engine_lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "gemma-b" for c in chunks)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}  # one completion, the engine's id
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
    assert response.chunk_times[-1] > READ_TIMEOUT  # nginx waited longer than its timeout


def test_through_swapgate_a_non_streaming_swap_answers_in_full(fronts) -> None:
    client = openai.OpenAI(base_url=f"{fronts['swapgate']}/v1", api_key="x", max_retries=0)
    with client:
        answer = client.chat.completions.create(model="gemma-a", **CHAT)  # type: ignore[call-overload]
    assert answer.id.startswith("chatcmpl-")
    assert (answer.choices[0].message.content or "").strip()
