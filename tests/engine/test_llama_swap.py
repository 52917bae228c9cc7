"""The deployment swapgate was made for, for real: two llama-swap instances (v250, built from the
project's shared folder, testbed/engines.py), each running llama.cpp's llama-server with
Gemma-3-270M for its models, swapgate in front, nginx (2 s ``proxy_read_timeout``) in front of
that. Each llama-swap runs with what its users turn on: ``sendLoadingState``, ``apiKeys`` (the
second), ``concurrencyLimit: 1`` on one model, a ``ttl`` on another, and ``groups``.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaSwapEngine
from tests.e2e.nginx import nginx
from tests.e2e.processes import Gateway, free_port, gateway, start, stop, wait_until_serving
from tests.e2e.wire import post

pytestmark = pytest.mark.engine
TOKEN = "llama-swap-admin"
KEY = "ls-2-key"  # the second llama-swap's apiKeys
ENV = {"TEST_ADMIN_TOKEN": TOKEN, "LS2_KEY": KEY}
MODELS = {"gemma-a": 2048, "gemma-b": 2048, "gemma-c": 2048, "gemma-ttl": 1024}
OPTIONS: dict[str, dict[str, object]] = {
    "gemma-c": {"concurrencyLimit": 1},
    "gemma-ttl": {"ttl": 2},
}
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class LlamaSwap:
    url: str
    key: str | None = None

    def ask(self, method: str, path: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
        return httpx.request(method, self.url + path, headers=headers, timeout=120)

    def running(self) -> dict[str, str]:
        body = self.ask("GET", "/running").raise_for_status().json()
        return {entry["model"]: entry["state"] for entry in body["running"]}


@pytest.fixture(scope="module")
def engine(swap_engine: LlamaSwapEngine) -> LlamaSwapEngine:
    return swap_engine


@contextmanager
def llama_swap(
    engine: LlamaSwapEngine, root: Path, extra: dict[str, object], key: str | None = None
) -> Iterator[LlamaSwap]:
    port = free_port()
    config = engine.write_config(root / f"llama-swap-{port}.yaml", MODELS, extra, OPTIONS)
    process = start(engine.command(config, port), log=root / f"llama-swap-{port}.log")
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", process)
        yield LlamaSwap(f"http://127.0.0.1:{port}", key)
    finally:
        stop(process, timeout=20)


@dataclass
class Deployment:
    swaps: tuple[LlamaSwap, LlamaSwap]
    gw: Gateway
    front: str  # nginx, in front of swapgate


@pytest.fixture(scope="module")
def deployment(engine: LlamaSwapEngine, tmp_path_factory: Any) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("llama-swap")
    with ExitStack() as stack:
        one = stack.enter_context(llama_swap(engine, root, {"sendLoadingState": True}))
        keyed = {"sendLoadingState": True, "apiKeys": [KEY]}
        two = stack.enter_context(llama_swap(engine, root, keyed, key=KEY))
        one.ask("GET", "/upstream/gemma-a/health").raise_for_status()  # warm before swapgate
        two.ask("GET", "/upstream/gemma-b/health").raise_for_status()
        listed = ["gemma-a", "gemma-b", "gemma-c", "gemma-ttl"]
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "5s", "min_residency": 0, "swap_timeout": "120s"},
            "keepalive": {"early_headers_after": "500ms", "interval": "500ms"},
            "instances": [
                {"name": "ls-1", "kind": "llama-swap", "url": one.url, "models": listed},
                {
                    "name": "ls-2",
                    "kind": "llama-swap",
                    "url": two.url,
                    "models": listed,
                    "api_key_env": "LS2_KEY",
                },
            ],
        }
        gw = stack.enter_context(gateway(config, ENV, log=root / "gateway.log"))
        fronts = stack.enter_context(nginx({"swapgate": gw.url}, read_timeout="2s"))
        yield Deployment((one, two), gw, fronts["swapgate"])


def states(gw: Gateway) -> dict[str, dict[str, str]]:
    """Per instance, each model's state as /admin/state says it now."""
    with gw.admin(TOKEN) as admin:
        body = admin.get("/admin/state").raise_for_status().json()
    return {i["name"]: {m: v["state"] for m, v in i["models"].items()} for i in body["instances"]}


def chats(url: str, model: str, count: int, stream: bool = False) -> list[httpx.Response]:
    body = {"model": model, "messages": HELLO, "max_tokens": 8, "stream": stream}
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(
            pool.map(lambda _: httpx.post(url + CHAT, json=body, timeout=120), range(count))
        )


def text(answer: httpx.Response) -> str:
    if answer.headers["content-type"].startswith("text/event-stream"):
        chunks = [
            json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
        ]
        assert all("choices" in c for c in chunks), answer.text  # an error event: which one
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    return str(answer.json()["choices"][0]["message"]["content"])


def within(seconds: float, check: Callable[[], bool]) -> float | None:
    """How long ``check`` took to hold, if it did within ``seconds``."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def test_warm_requests_go_to_their_instance_and_cold_ones_share_one_swap(
    deployment: Deployment,
) -> None:
    gw, front = deployment.gw, deployment.front
    assert states(gw)["ls-1"].get("gemma-a") == "warm"
    assert states(gw)["ls-2"].get("gemma-b") == "warm"
    warm = chats(front, "gemma-a", 6)
    keyed = chats(front, "gemma-b", 2)  # warm on ls-2, whose llama-swap wants its key
    swaps_before = gw.metric("swapgate_swaps_total")
    cold = chats(front, "gemma-c", 6, stream=True)
    for answer in warm + keyed + cold:
        assert answer.status_code == 200, answer.text
        assert text(answer).strip(), "real text from Gemma"
    assert {a.headers["x-swapgate-route"] for a in warm} == {"instance/ls-1"}
    assert {a.headers["x-swapgate-route"] for a in keyed} == {"instance/ls-2"}
    assert gw.metric("swapgate_swaps_total", model="gemma-a") == 0, "warm: no swap"
    assert gw.metric("swapgate_swaps_total", model="gemma-c", result="ok") == 1
    assert gw.metric("swapgate_swaps_total") == swaps_before + 1
    # sendLoadingState is on: a client of swapgate still sees only the engine's own chunks
    for answer in cold:
        assert "llama-swap loading" not in answer.text
        chunks = [
            json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")
        ]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert gw.metric("swapgate_upstream_errors_total", kind="auth") == 0, "ls-2's key went along"


def test_a_concurrency_limit_of_one_is_backpressure_never_a_429(deployment: Deployment) -> None:
    gw = deployment.gw
    answers = chats(deployment.front, "gemma-c", 4)
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert all(text(a).strip() for a in answers)
    assert gw.metric("swapgate_upstream_errors_total", kind="concurrency_limit") >= 1, (
        "llama-swap refused some (429) and swapgate queued them instead"
    )


def test_hand_loads_unloads_and_a_ttl_show_within_a_second(deployment: Deployment) -> None:
    gw = deployment.gw
    one, two = deployment.swaps
    one.ask("GET", "/upstream/gemma-b/health").raise_for_status()  # loaded by hand
    loaded = within(1.0, lambda: states(gw)["ls-1"].get("gemma-b") == "warm")
    one.ask("POST", "/api/models/unload/gemma-b").raise_for_status()  # unloaded by hand
    unloaded = within(1.0, lambda: states(gw)["ls-1"].get("gemma-b", "cold") == "cold")
    # gemma-ttl unloads itself 2 s after its last request (no keep-alives, so not through
    # nginx: the route header is final)
    body = {"model": "gemma-ttl", "messages": HELLO, "max_tokens": 4}
    quiet = {"x-swapgate-keepalive": "off"}
    answer = httpx.post(gw.url + CHAT, json=body, headers=quiet, timeout=120)
    assert answer.status_code == 200, answer.text
    where = answer.headers["x-swapgate-route"].removeprefix("instance/")
    ttl_swap = one if where == "ls-1" else two
    gone = within(30.0, lambda: "gemma-ttl" not in ttl_swap.running())
    assert gone is not None, "llama-swap's ttl unloaded it"
    shown = within(1.0, lambda: states(gw)[where].get("gemma-ttl", "cold") == "cold")
    assert loaded is not None, "a hand load shows within a second (poll_interval: 5s)"
    assert unloaded is not None, "a hand unload shows within a second"
    assert shown is not None, "a ttl unload shows within a second"


def test_a_group_that_keeps_two_models_works_with_capacity_two(
    engine: LlamaSwapEngine, tmp_path: Path
) -> None:
    group: dict[str, object] = {
        "groups": {"pair": {"swap": False, "members": ["gemma-a", "gemma-b"]}}
    }
    with llama_swap(engine, tmp_path, group) as pair:
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "5s", "min_residency": 0},
            "instances": [
                {
                    "name": "pair",
                    "kind": "llama-swap",
                    "url": pair.url,
                    "capacity": 2,
                    "models": ["gemma-a", "gemma-b"],
                }
            ],
        }
        with gateway(config, ENV) as gw:
            answers = [
                post(gw.url, CHAT, {"model": m, "messages": HELLO, "max_tokens": 4})
                for m in ("gemma-a", "gemma-b", "gemma-a", "gemma-b", "gemma-a")
            ]
            running = pair.running()
            loads = gw.metric("swapgate_swaps_total", result="ok")
    assert [a.status for a in answers] == [200] * 5
    assert running == {"gemma-a": "ready", "gemma-b": "ready"}, "both kept, as the group says"
    assert loads == 2, "each loaded once: swapgate never unloaded one for the other"
