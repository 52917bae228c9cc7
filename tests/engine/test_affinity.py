"""Prefix affinity against the real llama-server (docs/architecture.md, "Prefix affinity"): two
warm copies of one model, three conversations interleaved, every turn after the first back on
the copy that holds its prompt's KV cache (llama-server's own ``timings.cache_n``); with
``affinity_slack: 0`` the turns scatter and some read their whole prompt again."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaServerEngine, ensure_llama_server
from tests.e2e.processes import free_port, gateway

pytestmark = pytest.mark.engine
TOKEN = "affinity-admin"
SYSTEM = "You answer questions about birds in one short sentence. " * 25  # ~320 tokens
TOPICS = ("ducks", "geese", "swans")
ROUNDS = 2


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    # Gemma itself, not the tests' tiny Llama: without affinity, turns spread over both copies
    # only while a turn takes long enough to overlap the next.
    return ensure_llama_server()


def copies(engine: LlamaServerEngine, slack: int) -> dict[str, Any]:
    words = engine.single("gemma", "${PORT}", ctx=6144)
    words[words.index("-np") + 1] = "3"  # a slot for each conversation
    command = {"cmd": " ".join(words), "ready": "/health"}
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"min_residency": 0, "affinity_slack": slack},
        "instances": [
            {
                "name": name,
                "kind": "process",
                "capacity": 1,
                "start_port": free_port(),
                "commands": {"gemma": command},
            }
            for name in ("node-1", "node-2")
        ],
    }


def conversations(engine: LlamaServerEngine, slack: int) -> dict[str, list[dict[str, Any]]]:
    """Each conversation's turns' engine timings and route, the turns of a round sent 0.3 s
    apart in an order that turns each round."""
    seen: dict[str, list[dict[str, Any]]] = {topic: [] for topic in TOPICS}
    history = {t: [{"role": "system", "content": SYSTEM}] for t in TOPICS}
    with gateway(copies(engine, slack), {"TEST_ADMIN_TOKEN": TOKEN}) as gw:
        with gw.admin(TOKEN) as admin:  # both copies warm
            for name in ("node-1", "node-2"):
                body = {"model": "gemma", "instance": name}
                admin.post("/admin/preload", json=body, timeout=120).raise_for_status()

        def turn(topic: str) -> None:
            history[topic].append({"role": "user", "content": f"Tell me more about {topic}."})
            body = {"model": "gemma", "messages": history[topic], "max_tokens": 16}
            answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=120)
            answer.raise_for_status()
            reply = answer.json()
            history[topic].append(reply["choices"][0]["message"])
            route = answer.headers["x-swapgate-route"]
            seen[topic].append({**reply["timings"], "route": route})

        for round_ in range(ROUNDS):
            order = TOPICS[round_ % 3 :] + TOPICS[: round_ % 3]
            threads = []
            for topic in order:
                threads.append(threading.Thread(target=turn, args=(topic,)))
                threads[-1].start()
                time.sleep(0.3)
            for thread in threads:
                thread.join()
    return seen


def test_every_later_turn_finds_its_prompt_cached_with_affinity_and_not_without(
    engine: LlamaServerEngine,
) -> None:
    with_affinity = conversations(engine, slack=2)
    without = conversations(engine, slack=0)
    for topic, turns in with_affinity.items():
        assert len({t["route"] for t in turns}) == 1, f"{topic} stayed on its copy: {turns}"
        for later in turns[1:]:
            assert later["prompt_n"] < 100, f"{topic}: only its new tokens were read: {turns}"
    later_reads = [t["prompt_n"] for turns in without.values() for t in turns[1:]]
    assert max(later_reads) > 250, f"without affinity some turns read it all again: {without}"
    assert len(later_reads) == len(TOPICS) * (ROUNDS - 1)
    print(
        f"\nlater turns' prompt tokens read, with affinity: "
        f"{[t['prompt_n'] for ts in with_affinity.values() for t in ts[1:]]}; without: "
        f"{later_reads}"
    )
