"""Prefix affinity (swapgate/policy/affinity.py): a conversation's turns go back to the warm
copy that served it, whose engine holds its prompt's KV cache, within ``affinity_slack``."""

from __future__ import annotations

from typing import Any

from swapgate.policy.affinity import choose, conversation
from tests.unit.fakes import world

SYSTEM = {"role": "system", "content": "You are terse."}


def turns(first: str) -> list[dict[str, Any]]:
    user = {"role": "user", "content": first}
    one = {"model": "m", "messages": [SYSTEM, user]}
    two = {"model": "m", "messages": [SYSTEM, user, {"role": "assistant", "content": "ok"},
                                      {"role": "user", "content": "and then?"}]}  # fmt: skip
    return [one, two]


def test_every_turn_of_a_conversation_has_its_key_and_another_conversation_another() -> None:
    one, two = turns("Tell me about ducks.")
    assert conversation("m", one) == conversation("m", two) is not None
    assert conversation("m", turns("Tell me about geese.")[0]) != conversation("m", one)
    assert conversation("other", one) != conversation("m", one), "the model is part of it"
    assert conversation("m", {"prompt": "Once upon a time"}) is not None
    assert conversation("m", {"model": "m"}) is None, "no prompt, no conversation"


def test_it_goes_back_within_the_slack_and_to_the_least_busy_past_it() -> None:
    assert choose("x", {"x": 2, "y": 0}, "y", slack=2) == ("x", "hit")
    assert choose("x", {"x": 3, "y": 0}, "y", slack=2) == ("y", "overflow")
    assert choose("z", {"x": 0, "y": 0}, "x", slack=2) == ("x", "miss"), "z is not open"
    assert choose(None, {"x": 0, "y": 0}, "x", slack=2) == ("x", "miss")


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
    want = w.router.want("m", first, None)
    busy = await w.router.acquire("m", want=w.router.want("m", turns("other")[0], None))
    lease = await w.router.acquire("m", want=want)  # x is busy: the least busy copy
    assert (busy.name, lease.name) == ("x", "y")
    w.router.release(lease)
    again = await w.router.acquire("m", want=w.router.want("m", later, None))
    assert again.name == "y", "its next turn goes back to y"
    assert w.sample("swapgate_affinity_total", result="hit") == 1


async def test_with_slack_zero_there_is_no_affinity() -> None:
    w = world(config(slack=0))
    w.warm("x", "m")
    w.warm("y", "m")
    first, later = turns("Tell me about ducks.")
    assert w.router.want("m", first, None).conversation is None
    lease = await w.router.acquire("m", want=w.router.want("m", first, None))
    w.router.release(lease)
    again = await w.router.acquire("m", want=w.router.want("m", later, None))
    assert again.name == lease.name == "x", "the least busy, by name on a tie: no memory"
    assert w.sample("swapgate_affinity_total", result="hit") is None
