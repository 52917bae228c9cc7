"""Prefix affinity (swapgate/policy/affinity.py): a conversation's turns go back to the warm
copy that served it, whose engine holds its prompt's KV cache, within ``affinity_slack``."""

from __future__ import annotations

from typing import Any

from swapgate.policy.affinity import choose
from swapgate.policy.conversation import identity
from tests.unit.fakes import world

SYSTEM = {"role": "system", "content": "You are terse."}


def turns(first: str) -> list[dict[str, Any]]:
    user = {"role": "user", "content": first}
    one = {"model": "m", "messages": [SYSTEM, user]}
    two = {
        "model": "m",
        "messages": [
            SYSTEM,
            user,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and then?"},
        ],
    }
    return [one, two]


def test_every_turn_of_a_conversation_has_its_key_and_another_conversation_another() -> None:
    one, two = turns("Tell me about ducks.")
    assert identity("chat", "m", one) == identity("chat", "m", two) is not None
    assert identity("chat", "m", turns("Tell me about geese.")[0]) != identity("chat", "m", one)
    assert identity("chat", "other", one) != identity("chat", "m", one), "the model is part of it"
    assert identity("chat", "m", {"model": "m"}) is None, "no prompt, no conversation"
    assert identity("completions", "m", {"prompt": "Once upon a time"}) is None, "no slot"


def test_it_goes_back_within_the_slack_and_to_the_least_busy_past_it() -> None:
    assert choose("x", {"x": 2, "y": 0}, "y", slack=2) == ("x", "hit")
    assert choose("x", {"x": 3, "y": 0}, "y", slack=2) == ("y", "overflow")
    assert choose("z", {"x": 0, "y": 0}, "x", slack=2) == ("x", "miss"), "z is not open"
    assert choose(None, {"x": 0, "y": 0}, "x", slack=2) == ("x", "miss")


def routing_of(w: Any, payload: dict[str, Any]) -> Any:
    """The router's routing for ``payload``, with the conversation the data plane computes."""
    return w.router.intake.routing_for(
        "m", payload, None, conversation=identity("chat", "m", payload)
    )


def config(slack: int) -> dict[str, Any]:
    return {
        "routing": {"affinity_slack": slack},
        "instances": [{"name": n, "url": f"http://{n}", "models": ["m"]} for n in ("x", "y")],
    }


async def test_the_router_sends_a_conversation_back_to_its_copy() -> None:
    w = world(config(slack=2))
    w.warm("x", "m")
    w.warm("y", "m")
    first, later = turns("Tell me about ducks.")
    assert w.router.conversations.matter("m"), "two copies to choose among"
    routing = routing_of(w, first)
    busy = await w.router.acquire("m", routing=routing_of(w, turns("other")[0]))
    lease = await w.router.acquire("m", routing=routing)  # x is busy: the least busy copy
    assert (busy.name, lease.name) == ("x", "y")
    w.router.release(lease)
    again = await w.router.acquire("m", routing=routing_of(w, later))
    assert again.name == "y", "its next turn goes back to y"
    assert w.sample("swapgate_affinity_total", result="hit") == 1


async def test_with_slack_zero_there_is_no_affinity() -> None:
    w = world(config(slack=0))
    w.warm("x", "m")
    w.warm("y", "m")
    first, later = turns("Tell me about ducks.")
    assert not w.router.conversations.matter("m"), "no affinity: its key is not computed"
    lease = await w.router.acquire("m", routing=w.router.intake.routing_for("m", first, None))
    w.router.release(lease)
    again = await w.router.acquire("m", routing=w.router.intake.routing_for("m", later, None))
    assert again.name == lease.name == "x", "the least busy, by name on a tie: no memory"
    assert w.sample("swapgate_affinity_total", result="hit") is None


def test_a_conversation_is_computed_only_where_it_can_change_where_a_turn_goes() -> None:
    one = world({"instances": [{"name": "x", "url": "http://x", "models": ["m"]}]})
    assert not one.router.conversations.matter("m"), "one copy, no kv_keep: nothing to choose"
    kept = world(
        {
            "instances": [
                {
                    "name": "x",
                    "kind": "llama-swap",
                    "url": "http://x",
                    "models": ["m"],
                    "kv_keep": {"dir": "/tmp/kv"},
                }
            ]
        }
    )
    assert kept.router.conversations.matter("m"), "kv_keep assigns its slots"
