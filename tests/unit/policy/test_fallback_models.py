"""When another model answers (swapgate/policy/fallback_models.py): its rules as a table."""

from __future__ import annotations

import pytest

from swapgate.policy.fallback_models import (
    MARGIN,
    Outlook,
    first_able,
    refused_for_context,
    too_long,
    why_not,
)
from swapgate.policy.placement import Full, Join, Queue, Serve, Swap, Unavailable

NOWHERE = Unavailable("larger than every instance", lasting=True)
BACKING_OFF = Unavailable("its loads failed", backing_off=True)


@pytest.mark.parametrize(
    ("outlook", "reason"),
    [
        # 0. a model that serves: nothing happens (the normal path)
        (Outlook(Serve("x")), None),
        (Outlook(Full("x")), None),
        (Outlook(Swap("x"), expected_wait=30), None),  # no budget: it waits as it always did
        # 1. context, before anything else, even when warm
        (Outlook(Serve("x"), context=256, prompt_tokens=1000), "context"),
        (Outlook(NOWHERE, context=256, prompt_tokens=1000), "context"),
        (Outlook(Serve("x"), context=256, prompt_tokens=300), None),  # within the margin
        (Outlook(Serve("x"), context=None, prompt_tokens=10**6), None),  # context unknown
        (Outlook(Serve("x"), context=0, prompt_tokens=10**6), None),
        # 2. its own relay takes what it allows
        (Outlook(NOWHERE, relay="error"), None),
        (Outlook(BACKING_OFF, relay="swap"), None),
        (Outlook(Swap("x"), expected_wait=30, budget=5, relay="slow"), None),
        (Outlook(Swap("x"), expected_wait=30, budget=5, relay="error"), "wait_budget"),
        # 3. backoff
        (Outlook(BACKING_OFF), "backoff"),
        # 4. unavailable
        (Outlook(NOWHERE), "unavailable"),
        (Outlook(Unavailable("all down")), "unavailable"),
        # 5. wait budget, by the swap's (or the queue's) expected wait
        (Outlook(Swap("x"), expected_wait=30, budget=5), "wait_budget"),
        (Outlook(Join("x"), expected_wait=6, budget=5), "wait_budget"),
        (Outlook(Queue("x"), expected_wait=6, budget=5), "wait_budget"),
        (Outlook(Swap("x"), expected_wait=4, budget=5), None),
        (Outlook(Serve("x"), expected_wait=0, budget=0), None),
    ],
)
def test_why_a_model_cannot_serve(outlook: Outlook, reason: str | None) -> None:
    assert why_not(outlook) == reason


@pytest.mark.parametrize(
    ("tokens", "context", "expected"),
    [
        (320, 256, False),  # exactly the margin: not surely longer
        (321, 256, True),
        (10, None, False),
    ],
)
def test_a_prompt_is_too_long_only_past_the_margin(
    tokens: int, context: int | None, expected: bool
) -> None:
    assert MARGIN == 1.25
    assert too_long(tokens, context) is expected


def test_the_first_allowed_model_that_can_serve_answers() -> None:
    outlooks = {
        "big": Outlook(NOWHERE),
        "secret": Outlook(Serve("x")),
        "small": Outlook(Serve("y")),
        "later": Outlook(Serve("z")),
    }
    seen: list[str] = []

    def outlook(model: str) -> Outlook | None:
        seen.append(model)
        return outlooks.get(model)

    chosen = first_able(
        ["gone", "big", "secret", "small", "later"], lambda m: m != "secret", outlook
    )
    assert chosen == "small"
    assert seen == ["gone", "big", "small"], "a model the key may not use is not even looked at"


def test_no_model_can_serve_gives_none() -> None:
    assert first_able(["a", "b"], lambda m: True, lambda m: Outlook(NOWHERE)) is None
    assert first_able(["a"], lambda m: False, lambda m: Outlook(Serve("x"))) is None
    assert first_able([], lambda m: True, lambda m: Outlook(Serve("x"))) is None


LLAMA_SERVER = (  # llama.cpp's llama-server, -c 256, as it answered here
    b'{"error":{"code":400,"message":"request (799 tokens) exceeds the available context size'
    b' (256 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":799}}'
)
VLLM = (
    b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens. However,'
    b' you requested 3000 tokens (2996 in the messages, 4 in the completion).","code":400}'
)


@pytest.mark.parametrize("body", [LLAMA_SERVER, VLLM])
def test_an_engines_refusal_of_a_prompt_past_its_context_is_told(body: bytes) -> None:
    assert refused_for_context(400, body)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, b'{"error":{"message":"temperature must be positive"}}'),
        (500, LLAMA_SERVER),  # a failure, for the retry rule: not the prompt's length
        (200, b'{"choices":[{"text":"the maximum context length is 4096"}]}'),
        (400, b""),
    ],
)
def test_other_answers_are_not_a_refusal_for_context(status: int, body: bytes) -> None:
    assert not refused_for_context(status, body)
