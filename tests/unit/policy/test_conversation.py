"""A conversation's identity (swapgate/policy/conversation.py): the same on every turn from the
first, in each API shape agents send, and another for another conversation."""

from __future__ import annotations

from typing import Any

import pytest

from swapgate.policy.conversation import identity, scoped

SYSTEM = "You are a coding agent. " * 40


def anthropic_turns(first: str, system: Any = SYSTEM) -> list[dict[str, Any]]:
    """Claude Code's shape: the newest message carries ``cache_control``, and ``system`` starts
    with a billing line that changes at every request."""
    ask = {"type": "text", "text": first}
    one = {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=a1;"},
            {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{**ask, "cache_control": {"type": "ephemeral"}}]}
        ],
    }
    two = {
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=b2;"},
            {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [ask]},
            {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Now the tests.",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    }
    return [one, two]


CONTEXT = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": "<permissions>workspace</permissions>"}],
}


def responses_turns(
    first: str, session: str | None = None, context: bool = False
) -> list[dict[str, Any]]:
    """``instructions``, then input items sent again in full every turn; Codex's start with
    the same context items in every session, and name the session (``prompt_cache_key``)."""
    ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}
    head = [CONTEXT] if context else []
    one: dict[str, Any] = {"instructions": SYSTEM, "input": [*head, ask]}
    two: dict[str, Any] = {
        "instructions": SYSTEM,
        "input": [
            *head,
            ask,
            {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    if session is not None:
        one["prompt_cache_key"] = two["prompt_cache_key"] = session
    return [one, two]


def chat_turns(first: str, system: bool) -> list[dict[str, Any]]:
    head = [{"role": "system", "content": SYSTEM}] if system else []
    user = {"role": "user", "content": first}
    one = {"messages": [*head, user]}
    two = {
        "messages": [
            *head,
            user,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and then?"},
        ]
    }
    return [one, two]


@pytest.mark.parametrize(
    ("shape", "make"),
    [
        ("messages", lambda first: anthropic_turns(first)),
        ("responses", lambda first: responses_turns(first)),
        ("chat", lambda first: chat_turns(first, system=True)),
        ("chat", lambda first: chat_turns(first, system=False)),
    ],
    ids=["anthropic", "responses", "chat", "chat-without-system"],
)
def test_turn_one_and_turn_two_are_one_conversation_and_another_start_another(
    shape: str, make: Any
) -> None:
    one, two = make("Fix the parser.")
    assert identity(shape, "m", one) == identity(shape, "m", two) is not None
    assert identity(shape, "m", make("Write the docs.")[0]) != identity(shape, "m", one)


def test_a_string_input_is_read_by_its_start() -> None:
    long = "Summarise this: " + "x" * 5000
    assert identity("responses", "m", {"input": long}) == identity(
        "responses", "m", {"input": long + " and more"}
    )


def test_two_sessions_that_start_alike_are_two_conversations_when_the_client_names_them() -> None:
    first, later = responses_turns("Fix the parser.", session="thread-1", context=True)
    other, _ = responses_turns("Write the docs.", session="thread-2", context=True)
    assert identity("responses", "m", first) == identity("responses", "m", later)
    assert identity("responses", "m", first) != identity("responses", "m", other)
    claude = anthropic_turns("Fix the parser.")[0]
    again = {**claude, "metadata": {"user_id": "user_1_account_2_session_3"}}
    assert identity("messages", "m", claude) != identity("messages", "m", again)


@pytest.mark.parametrize("shape", ["completions", "embeddings", "rerank", "count_tokens"])
def test_requests_that_are_no_turn_have_no_identity(shape: str) -> None:
    assert identity(shape, "m", {"prompt": "hi", "input": "hi", "messages": []}) is None


def test_a_key_scopes_a_conversation() -> None:
    assert scoped("k", "alice") != scoped("k", "bob") != "k"
    assert scoped("k", None) == "k", "no client keys: one tenant"
