"""The timeout wall: nginx with proxy_read_timeout 2s in front of a 5-second swap.

Direct to the simulator, nginx gives up and the client gets 504 although the load succeeds.
Through swapgate, early headers and keep-alive bytes keep nginx reading: every request gets its
full answer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.nginx import NGINX, nginx
from tests.e2e.processes import gateway, instance, simulator

pytestmark = pytest.mark.e2e
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
LOAD = 5.0


@pytest.fixture(scope="module")
def fronts() -> Iterator[dict[str, str]]:
    with simulator(load_time=LOAD) as direct, simulator(load_time=LOAD) as behind:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "500ms", "interval": "1s"},
            "instances": [instance("gpu-a", behind)],
        }
        with gateway(config) as gw, nginx({"direct": direct.url, "swapgate": gw.url}) as urls:
            yield urls


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)


def test_without_swapgate_nginx_times_out_during_a_swap(fronts) -> None:
    with _client(fronts["direct"]) as client:
        with pytest.raises(openai.APIStatusError) as streaming:
            client.chat.completions.create(model="a", messages=MESSAGES, stream=True)
        assert streaming.value.status_code == 504
        with pytest.raises(openai.APIStatusError) as plain:
            client.chat.completions.create(model="b", messages=MESSAGES)
        assert plain.value.status_code == 504


def test_through_swapgate_every_swap_answers_in_full(fronts) -> None:
    with _client(fronts["swapgate"]) as client:
        stream = client.chat.completions.create(
            model="a", messages=MESSAGES, stream=True, max_tokens=6
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in stream) == "Hello from a. Tokens flow"
        )
        answer = client.chat.completions.create(model="b", messages=MESSAGES, max_tokens=6)
        assert answer.choices[0].message.content == "Hello from b. Tokens flow"
        assert answer.model == "b"


def test_the_shipped_nginx_snippet_is_valid_nginx(tmp_path) -> None:
    snippet = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "swapgate.conf"
    config = tmp_path / "nginx.conf"
    config.write_text(
        f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\n"
        f"events {{}}\nhttp {{ access_log off; include {snippet}; }}\n"
    )
    result = subprocess.run(
        [NGINX, "-t", "-c", str(config), "-p", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr
