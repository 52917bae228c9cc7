"""Per-request routing (docs/operations.md): prompt sizes, pool choice, wait budgets."""

from __future__ import annotations

import pytest

from swapgate.config.settings import PoolConfig
from swapgate.data.snapshot import InstanceView, Snapshot
from swapgate.errors import BadRequest
from swapgate.policy.pools import choose, prompt_tokens
from swapgate.proxy.headers import wait_budget


@pytest.mark.parametrize(
    ("payload", "tokens"),
    [
        ({"messages": [{"role": "user", "content": "x" * 400}]}, 100),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 41}]}]}, 11),
        ({"system": "s" * 8, "messages": [{"role": "user", "content": "u" * 8}]}, 4),
        ({"prompt": ["ab" * 10, "cd" * 10]}, 10),
        ({"input": "y" * 12}, 3),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 0),
        ({"messages": "not a list"}, 0),
    ],
)
def test_the_prompt_is_its_characters_over_four(payload: dict[str, object], tokens: int) -> None:
    assert prompt_tokens(payload) == tokens


POOLS = [
    PoolConfig(name="interactive", instances=["a", "b"], max_prompt_tokens=4096),
    PoolConfig(name="batch", instances=["c"]),
]


def snap(*down: str) -> Snapshot:
    views = tuple(
        InstanceView(n, n not in down, False, 1, 1.0, 0, frozenset({"m"}), {}, None, 0.0, 0.0)
        for n in "abc"
    )
    return Snapshot(0.0, views)


@pytest.mark.parametrize(
    ("tokens", "down", "pool"),
    [
        (100, (), "interactive"),
        (4096, (), "interactive"),
        (4097, (), "batch"),
        (100, ("a",), "interactive"),  # one of its instances is enough
        (100, ("a", "b"), "batch"),  # all down: the next pool it fits
        (30_000, ("c",), "batch"),  # never a pool it exceeds: placement says batch is down
    ],
)
def test_the_first_pool_it_fits_and_that_serves(
    tokens: int, down: tuple[str, ...], pool: str
) -> None:
    assert choose("m", POOLS, tokens, snap(*down)).name == pool


def test_a_prompt_no_pool_takes_is_a_400_naming_the_limits() -> None:
    with pytest.raises(BadRequest, match=r"about 5000 tokens.*max_prompt_tokens: only 4096"):
        choose(
            "m", [PoolConfig(name="only", instances=["a"], max_prompt_tokens=4096)], 5000, snap()
        )


@pytest.mark.parametrize(
    ("value", "seconds"), [(b"5s", 5.0), (b"500ms", 0.5), (b" 2 ", 2.0), (None, None)]
)
def test_the_wait_budget_header(value: bytes | None, seconds: float | None) -> None:
    headers = [(b"x-swapgate-max-wait", value)] if value is not None else []
    assert wait_budget(headers) == seconds


@pytest.mark.parametrize("value", [b"soon", b"-1s", b""])
def test_a_wait_budget_that_is_not_a_duration_is_a_400(value: bytes) -> None:
    with pytest.raises(BadRequest, match="x-swapgate-max-wait"):
        wait_budget([(b"x-swapgate-max-wait", value)])
