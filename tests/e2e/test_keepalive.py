"""The keep-alive protocol of docs/operations.md on the wire, with the openai SDK and raw
sockets."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e import wire
from tests.e2e.processes import Gateway, Sim, gateway, instance, simulator

pytestmark = pytest.mark.e2e
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
EARLY = 0.3
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Gateway, Sim]]:
    with simulator(models=("a", "b", "r", "slow"), load_time=1.5) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": f"{EARLY}s", "interval": "400ms"},
            "instances": [instance("gpu-a", sim)],
            "models": {
                "r": {"keepalive": {"streaming": "reasoning"}},
                "slow": {"max_wait": "700ms"},
            },
        }
        with gateway(config) as gw:
            yield gw, sim


def _body(model: str, stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "stream": stream, "max_tokens": 5, **extra}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_a_stream_waiting_for_a_swap_gets_early_headers_then_comments(fleet) -> None:
    gw, sim = fleet
    resident_at_first_byte: dict[str, str] = {}

    def watch() -> None:  # what the simulator was doing when the first byte arrived
        time.sleep(EARLY + 0.15)
        resident_at_first_byte.update(sim.stats()["resident"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    response = wire.post(gw.url, CHAT, _body("a", stream=True))
    watcher.join()

    assert response.first_byte_after < EARLY + 0.1
    assert resident_at_first_byte == {"a": "starting"}, "the swap was still running"
    assert response.status == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["cache-control"] == "no-cache"
    lines = [line for line in response.lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    assert comments[0].startswith(": swapgate loading a on gpu-a, eta ")
    assert len(comments) >= 3, "one at commit, then one every interval of a 1.5 s swap"
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert lines[-1].startswith(": swapgate waited ")  # the whole wait, after the engine's end
    assert all(line.startswith("data:") for line in lines[first_data:-1]), "pings stop at data"
    payloads = [line.removeprefix("data: ") for line in response.data_lines()]
    assert payloads[-1] == "[DONE]"
    assert all(_is_json(p) for p in payloads[:-1])


def test_keepalives_go_on_until_the_engines_first_byte_not_just_its_headers() -> None:
    # A real engine sends a stream's headers at once and its first token after reading the
    # prompt, which after a swap (cold caches, a long prompt) can take longer than a proxy waits.
    with simulator(load_time=0.5, prefill=1.5) as sim:
        config = {
            "routing": {"min_residency": 0},
            "keepalive": {"early_headers_after": "100ms", "interval": "200ms"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            response = wire.post(gw.url, CHAT, _body("a", stream=True))
    assert response.first_event_after is not None
    assert response.first_event_after > 0.5 + 1.5
    pinging = [t for t in response.chunk_times if t < response.first_event_after]
    gaps = [later - earlier for earlier, later in itertools.pairwise(pinging)]
    assert max(gaps) < 0.6, f"a pause of {max(gaps):.2f}s in the keep-alives"
    lines = [line for line in response.lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    assert lines[first_data - 1].startswith(": swapgate waiting for a on gpu-a")
    assert all(line.startswith("data:") for line in lines[first_data:-1]), "pings stop at data"
    assert lines[-2:] == ["data: [DONE]", lines[-1]]
    assert lines[-1].startswith(": swapgate waited ")


def test_a_warm_request_committed_before_the_engine_answers_names_its_instance() -> None:
    # Warm: the instance is chosen and the request sent before the early headers go out, so
    # they say where it went, not ``pending``: an engine that answers (headers and all) 1 s
    # after it is asked.
    with simulator(load_time=0.2, ttft=1.0) as sim:
        config = {
            "keepalive": {"early_headers_after": "100ms", "interval": "200ms"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            httpx.post(f"{gw.url}{CHAT}", json=_body("a", stream=False), timeout=30)
            body = _body("a", stream=True)
            with httpx.stream("POST", f"{gw.url}{CHAT}", json=body, timeout=30) as response:
                assert response.headers["x-swapgate-keepalive"] == "comment"  # sent early
                assert response.headers["x-swapgate-route"] == "instance/gpu-a"
                assert "data: [DONE]" in response.read().decode()


def test_a_non_streaming_request_gets_newlines_then_the_json_body(fleet) -> None:
    gw, _ = fleet
    response = wire.post(gw.url, CHAT, _body("b", stream=False))
    assert response.status == 200
    assert response.headers["content-type"] == "application/json"
    assert response.body.startswith(b"\n")
    answer = json.loads(response.body)
    assert answer["choices"][0]["message"]["content"] == "Hello from b. Tokens"  # 5 tokens


def test_reasoning_mode_chunks_parse_in_the_openai_sdk(fleet) -> None:
    """``streaming: reasoning``, from before ``progress``, means ``progress: reasoning``."""
    gw, _ = fleet
    with gw.sdk() as client:
        reasoning, content = [], []
        for chunk in client.chat.completions.create(
            model="r", messages=MESSAGES, stream=True, max_tokens=4
        ):
            delta = chunk.choices[0].delta
            if getattr(delta, "reasoning_content", None):
                reasoning.append(delta.reasoning_content)
                assert chunk.model == "r"
                assert chunk.id
            content.append(delta.content or "")
    assert reasoning
    assert reasoning[0].startswith("Loading r on gpu-a: "), reasoning  # the load's progress
    assert reasoning[-1].startswith("r answers after "), reasoning  # the wait's total
    assert "".join(content) == "Hello from r."


def test_anthropic_and_responses_streams_with_progress_on_get_none_and_parse_in_the_sdks(
    fleet,
) -> None:
    """Messages and Responses streams have no place for progress a client tolerates: through a
    swap with it on, each SDK reads every event, and none is swapgate's."""
    gw, _ = fleet
    httpx.post(gw.url + CHAT, json=_body("a", False), timeout=30)  # r is not warm
    hello: list[anthropic.types.MessageParam] = [{"role": "user", "content": "hello"}]
    with (
        anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0) as claude,
        claude.messages.stream(model="r", max_tokens=5, messages=hello) as stream,
    ):
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert [block.type for block in message.content] == ["text"], "no thinking block"
    assert message.content[0].text.startswith("Hello from r.")  # type: ignore[union-attr]
    assert kinds[0] == "message_start", kinds
    assert kinds[-1] == "message_stop", kinds
    httpx.post(gw.url + CHAT, json=_body("a", False), timeout=30)
    with gw.sdk() as client:
        events = list(client.responses.create(model="r", input="hello", stream=True))
    done = events[-1]
    assert done.type == "response.completed", [e.type for e in events]
    assert [item.type for item in done.response.output] == ["message"], "no reasoning item"
    assert done.response.output_text.startswith("Hello from r.")
    assert not any("reasoning" in event.type for event in events)


def test_max_wait_after_the_commit_is_an_in_band_error(fleet) -> None:
    gw, _ = fleet
    with gw.sdk() as client, pytest.raises(openai.APIError) as failure:
        for _ in client.chat.completions.create(model="slow", messages=MESSAGES, stream=True):
            pass
    assert "did not become warm within max_wait" in failure.value.message
    assert failure.value.code == "no_capacity"


@pytest.fixture
def failing() -> Iterator[tuple[Gateway, Sim]]:
    with simulator(models=("a",), load_time=0.3, fail_load_rate=1.0) as sim:
        config = {
            "routing": {"poll_interval": "1h"},
            "keepalive": {"early_headers_after": "100ms", "interval": "300ms"},
            "instances": [instance("gpu-a", sim)],
        }
        with gateway(config) as gw:
            yield gw, sim


def test_a_swap_that_fails_after_the_commit_ends_the_stream_with_an_error(failing) -> None:
    gw, _ = failing
    with gw.sdk() as client, pytest.raises(openai.APIError) as failure:
        for _ in client.chat.completions.create(model="a", messages=MESSAGES, stream=True):
            pass
    assert failure.value.code == "swap_failed"
    assert "failed swap" in failure.value.message


def test_a_swap_that_fails_after_the_commit_gives_a_non_streaming_client_an_error_object(
    failing,
) -> None:
    gw, _ = failing
    response = wire.post(gw.url, CHAT, _body("a", stream=False))
    assert response.status == 200
    error = json.loads(response.body)["error"]
    assert error["code"] == "swap_failed"
    assert error["type"] == "swapgate_error"


def test_the_opt_out_header_waits_silently_and_keeps_real_status_codes(failing) -> None:
    gw, _ = failing
    response = wire.post(gw.url, CHAT, _body("a", stream=True), {"x-swapgate-keepalive": "off"})
    # One load (its failure carries the engine's words: not tried again), nothing sent meanwhile
    assert response.first_byte_after > 0.3, "nothing was sent while the load failed"
    assert response.status == 503
    assert json.loads(response.body)["error"]["code"] == "swap_failed"
    assert response.headers["retry-after"]


def test_a_warm_answer_is_byte_for_byte_the_upstreams() -> None:
    with simulator(models=("a",), load_time=0.1, api_key="k") as sim:
        httpx.get(f"{sim.url}/upstream/a/health", timeout=5).raise_for_status()
        config = {
            "instances": [instance("gpu-a", sim, api_key_env="TEST_KEY")],
            "keepalive": {"early_headers_after": "1s"},
        }
        with gateway(config, {"TEST_KEY": "k"}) as gw:
            response = httpx.post(f"{gw.url}{CHAT}", json=_body("a", stream=False), timeout=10)
            assert response.status_code == 200
            assert response.content == httpx.get(f"{sim.url}/sim/last-response").content
            assert response.headers["content-length"] == str(len(response.content))
            assert response.headers["x-swapgate-route"] == "instance/gpu-a"
            assert "x-swapgate-keepalive" not in response.headers


def test_an_upstream_error_status_passes_through_untouched() -> None:
    # (A 401/403 no longer does: it is about swapgate's own key, tests/e2e/test_faults.py.)
    with simulator("openai", models=("a",), load_time=0.1) as sim:
        # The config says the instance serves "b" too; the server itself does not know it.
        listed = instance("gpu-a", sim, kind="openai", models=["a", "b"])
        with gateway({"instances": [listed]}) as gw:
            response = httpx.post(f"{gw.url}{CHAT}", json=_body("b", stream=False), timeout=10)
            assert response.status_code == 404
            assert response.json()["error"]["message"] == "model 'b' not found"  # the sim's own
            assert response.headers["x-swapgate-route"] == "instance/gpu-a"
