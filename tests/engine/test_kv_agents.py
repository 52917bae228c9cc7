"""Conversations that survive swaps in the traffic coding agents send (docs/kv-keep.md), against
the real llama-server: several conversations at once on a server with several slots, in the
Anthropic Messages shape, a swap away and back, and their next turns sent together. What is
measured is what the engine itself says it read (its ``llamacpp:prompt_tokens_total``): only
what each turn added, or the whole prompt again.

Also: a file made by another model is never restored; one client key's KV never reaches
another key's turn unless ``share_across_keys``; and llama-swap, through ``/upstream/MODEL``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from bench.redis import redis_server
from testbed.engines import LlamaServerEngine, LlamaSwapEngine, ensure_llama_server, tiny_weights
from testbed.served import engine_url, prompt_tokens_read
from tests.e2e.processes import free_port, gateway, start, stop, wait_until_serving
from tests.engine.conftest import kv_router, process_node

pytestmark = pytest.mark.engine
TOKEN = "kv-admin"
# Gemma 3's sliding window: a restored cache is reused only with --swa-full
FLAGS = ("--swa-full", "--metrics")
TOPICS = ("loons of the northern lakes", "terns of the coast", "owls of the pine woods")


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


def system_prompt(topic: str) -> str:
    """~300 of Gemma's tokens, another per conversation: ten times a turn's."""
    return f"You answer questions about {topic} in one short sentence. " * 22


def node(
    engine: LlamaServerEngine, kv: Path, slots: int, command: tuple[str, ...] = (), **keep: Any
) -> dict[str, Any]:
    flags = [*FLAGS, "-np", str(slots), *command]
    commands = {
        name: {
            "cmd": " ".join([*engine.single(name, "${PORT}", ctx=8192), *flags]),
            "ready": "/health",
        }
        for name in ("a", "b")
    }
    return process_node(commands, kv_keep={"dir": str(kv), "budget": "1GiB", **keep})


class Conversation:
    """One agent's conversation in the Anthropic Messages shape, as Claude Code sends it: a
    system prompt in blocks, ``cache_control`` on the newest message."""

    def __init__(self, client: anthropic.Anthropic, topic: str) -> None:
        self.client, self.topic = client, topic
        self.history: list[dict[str, Any]] = []

    def turn(self, number: int) -> None:
        ask = {
            "type": "text",
            "text": f"Question {number}: tell me of them.",
            "cache_control": {"type": "ephemeral"},
        }
        for message in self.history:
            message["content"] = [
                {k: v for k, v in block.items() if k != "cache_control"}
                for block in message["content"]
            ]
        self.history.append({"role": "user", "content": [ask]})
        reply = self.client.messages.create(
            model="a",
            max_tokens=4,
            messages=self.history,  # type: ignore[arg-type]
            system=[
                {
                    "type": "text",
                    "text": system_prompt(self.topic),
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        )
        text = "".join(block.text for block in reply.content if block.type == "text") or "."
        self.history.append({"role": "assistant", "content": [{"type": "text", "text": text}]})


def at_once(work: list[Callable[[], None]]) -> None:
    with concurrent.futures.ThreadPoolExecutor(len(work)) as pool:
        for done in [pool.submit(job) for job in work]:
            done.result()


def test_three_anthropic_conversations_come_back_at_once_each_into_its_own_slot(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    with (
        gateway(node(engine, tmp_path / "kv", slots=4), {"TEST_ADMIN_TOKEN": TOKEN}) as gw,
        anthropic.Anthropic(base_url=gw.url, api_key="local", max_retries=0) as client,
    ):
        agents = [Conversation(client, topic) for topic in TOPICS]
        at_once([lambda agent=agent: agent.turn(1) for agent in agents])  # type: ignore[misc]
        first = prompt_tokens_read(engine_url(gw.process.pid, "a"))
        at_once([lambda agent=agent: agent.turn(2) for agent in agents])  # type: ignore[misc]
        warm = prompt_tokens_read(engine_url(gw.process.pid, "a")) - first
        client.messages.create(
            model="b", max_tokens=4, messages=[{"role": "user", "content": "Hi."}]
        )
        at_once([lambda agent=agent: agent.turn(3) for agent in agents])  # type: ignore[misc]
        # a started again: what it read since the swap back
        after = prompt_tokens_read(engine_url(gw.process.pid, "a"))
        saves = gw.metric("swapgate_kv_saves_total", model="a", result="ok")
        restores = gw.metric("swapgate_kv_restores_total", model="a", result="ok")
    print(
        f"\nthree conversations: turn 1 read {first} tokens, turn 2 {warm}, turn 3 after a swap "
        f"away and back {after} ({saves:.0f} saved, {restores:.0f} restored)"
    )
    assert first > 3 * 250, "each read its system prompt"
    assert warm < 3 * 40, "each warm turn went back to its own slot"
    assert (saves, restores) == (3, 3)
    assert after < 3 * 40, "each restored into its own slot: none read its prompt again"


def turn_of(url: str, model: str, history: list[dict[str, Any]], key: str = "k") -> int:
    """One chat turn; the prompt tokens the engine read for it (its own ``timings``)."""
    body = {"model": model, "messages": history, "max_tokens": 4}
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        timeout=180,
        headers={"authorization": f"Bearer {key}"},
    )
    answer.raise_for_status()
    reply: dict[str, Any] = answer.json()
    history.append(reply["choices"][0]["message"])
    read: int = reply["timings"]["prompt_n"]
    return read


def swap_away_and_back(url: str, key: str = "k") -> None:
    turn_of(url, "b", [{"role": "user", "content": "Hi."}], key)


def test_a_file_made_with_another_command_is_never_restored(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    kv = tmp_path / "kv"
    history = [
        {"role": "system", "content": system_prompt(TOPICS[0])},
        {"role": "user", "content": "Question 1."},
    ]
    with gateway(node(engine, kv, slots=2)) as gw:
        turn_of(gw.url, "a", history)
        swap_away_and_back(gw.url)  # a's conversation saved
    assert list((kv / "node").glob("a--*.bin"))
    changed = node(engine, kv, slots=2, command=("--rope-freq-base", "20000"))
    with gateway(changed) as gw:
        history.append({"role": "user", "content": "Question 2."})
        read = turn_of(gw.url, "a", history)
        stale = gw.metric("swapgate_kv_restores_total", result="stale")
        restored = gw.metric("swapgate_kv_restores_total", result="ok")
    assert (stale, restored) == (1, 0)
    assert read > 250, "the whole prompt, read by the model as it runs now"


@pytest.mark.parametrize("shared", [False, True], ids=["own", "share_across_keys"])
def test_one_keys_saved_conversation_reaches_another_key_only_if_shared(
    engine: LlamaServerEngine, tmp_path: Path, shared: bool
) -> None:
    keys = {"alice": "sk-alice", "bob": "sk-bob"}
    config = node(engine, tmp_path / "kv", slots=2, share_across_keys=shared)
    config["auth"] = {"keys": [{"name": name, "sha256": _sha(key)} for name, key in keys.items()]}
    same = [
        {"role": "system", "content": system_prompt(TOPICS[1])},
        {"role": "user", "content": "Question 1."},
    ]
    with gateway(config) as gw:
        turn_of(gw.url, "a", [*same], keys["alice"])
        swap_away_and_back(gw.url, keys["alice"])  # alice's conversation saved
        read = turn_of(gw.url, "a", [*same], keys["bob"])
        restored = gw.metric("swapgate_kv_restores_total", result="ok")
    if shared:
        assert (restored, read < 40) == (1, True), read
    else:
        assert (restored, read > 250) == (0, True), read


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.mark.parametrize("save_path", ["kv_keep.dir", "a subfolder of it"])
def test_through_llama_swap_a_conversation_survives_its_swap(
    swap_engine: LlamaSwapEngine, tmp_path: Path, save_path: str
) -> None:
    """With the commands' --slot-save-path at kv_keep.dir, a conversation comes back; at
    another folder (a subfolder, a container mount) nothing can be, and the log says why."""
    kv = tmp_path / "kv"
    saves_into = kv if save_path == "kv_keep.dir" else kv / "sub"
    saves_into.mkdir(parents=True)
    flags = ("--swa-full", "--slot-save-path", str(saves_into))
    config = swap_engine.write_config(
        tmp_path / "llama-swap.yaml", {"a": 4096, "b": 4096}, flags=flags
    )
    port = free_port()
    process = start(swap_engine.command(config, port), log=tmp_path / "llama-swap.log")
    log = tmp_path / "gateway.log"
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", process)
        instance = {
            "name": "ls",
            "kind": "llama-swap",
            "url": f"http://127.0.0.1:{port}",
            "models": ["a", "b"],
            "kv_keep": {"dir": str(kv)},
        }
        settings = {"routing": {"min_residency": 0}, "instances": [instance]}
        with gateway(settings, log=log) as gw:
            history = [
                {"role": "system", "content": system_prompt(TOPICS[2])},
                {"role": "user", "content": "Question 1."},
            ]
            first = turn_of(gw.url, "a", history)
            swap_away_and_back(gw.url)
            history.append({"role": "user", "content": "Question 2."})
            after = turn_of(gw.url, "a", history)
            restores = gw.metric("swapgate_kv_restores_total", result="ok")
            missing = gw.metric("swapgate_kv_saves_total", result="missing")
    finally:
        stop(process, timeout=20)
    print(f"\nllama-swap: turn 1 read {first} tokens, the turn after a swap away and back {after}")
    assert first > 250
    if saves_into == kv:
        assert restores == 1
        assert after < 40, "only its new tokens"
        return
    assert restores in (None, 0.0)
    assert missing is not None
    assert missing >= 1, "a save swapgate cannot restore is counted"
    told = [line for line in log.read_text().splitlines() if "kv_keep.dir" in line]
    assert all(" ERROR " in line and str(kv) in line for line in told), told
    named = [line.split("swapgate.kv: ")[1].split(":")[0] for line in told]
    assert "ls/a" in named
    assert len(named) == len(set(named)), "once per model, not at every save"
    assert after > 250, "read again in full: nothing was restored"


def test_two_replicas_on_redis_in_front_of_one_router_keep_both_conversations(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    conversations = [
        [
            {"role": "system", "content": system_prompt(topic)},
            {"role": "user", "content": "Question 1."},
        ]
        for topic in TOPICS[:2]
    ]
    with (
        kv_router(engine, tmp_path, slots=2, ctx=8192) as config,
        redis_server() as redis,
        ExitStack() as stack,
    ):
        cluster = {"SWAPGATE_REDIS_URL": redis.url}
        gws = [
            stack.enter_context(gateway(config, {**cluster, "SWAPGATE_CLUSTER__REPLICA_ID": name}))
            for name in ("r1", "r2")
        ]
        pairs = list(zip(gws, conversations, strict=True))
        at_once([lambda gw=gw, c=c: turn_of(gw.url, "a", c) for gw, c in pairs])  # type: ignore[misc]
        swap_away_and_back(gws[0].url)  # r1 unloads a: both conversations saved
        for conversation in conversations:
            conversation.append({"role": "user", "content": "Question 2."})
        read: list[int] = []
        at_once([lambda gw=gw, c=c: read.append(turn_of(gw.url, "a", c)) for gw, c in pairs])  # type: ignore[misc]
        restores = sum(gw.metric("swapgate_kv_restores_total", result="ok") for gw in gws)
    print(f"\ntwo replicas: after the swap the turns read {read} tokens, {restores:.0f} restored")
    assert restores == 2
    assert max(read) < 40, f"each restored into its own slot: {read}"
