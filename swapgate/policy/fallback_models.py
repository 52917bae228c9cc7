"""When another model of this gateway answers a request (``models.M.fallbacks``,
docs/configuration.md, "Fallback models"): a pure function of what each model offers it now.

Not the relay's rule (swapgate/policy/relay.py): that sends a model's own request to an
external relay; this one sends it to the next model of its ``fallbacks`` that can serve it.

``why_not`` says why a model cannot serve a request, by these rules in this order:
  1. context      its prompt is longer than the model's ``context``, by more than MARGIN (the
                  length is an estimate: a prompt near the limit is left to the model);
  2. relayed      its own relay takes what follows (its ``fallback`` policy allows it): None;
  3. backoff      its loads failed lately and it backs off on every instance that serves it;
  4. unavailable  no instance can hold it (too large, none up, none serving it);
  5. wait_budget  the request's ``x-swapgate-max-wait`` ends before its swap (or queue) would.
``swap_failed`` is not decided here: the swap a request waited for failed (the router says).
Nor is a prompt the estimate let through that the model's engine then refused as past its
context (``refused_for_context``): that is ``context`` too, once the engine said so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from swapgate.config.settings import RelayPolicy
from swapgate.policy.placement import Decision, Full, Serve, Unavailable
from swapgate.policy.relay import allows

Reason = Literal["swap_failed", "backoff", "unavailable", "context", "wait_budget"]
# The prompt's estimate (characters / 4) must pass the context by a quarter: an estimate that
# is a quarter too high (short words, code) still does not send a prompt that fits elsewhere.
MARGIN = 1.25
# What engines answer, with a 400, to a prompt longer than their context: llama.cpp's
# llama-server (its error type, then its message), vLLM and OpenAI, llama-cpp-python's server
PAST_CONTEXT = (
    "exceed_context_size_error",
    "exceeds the available context size",
    "maximum context length",
    "context_length_exceeded",
    "exceed context window",
)


@dataclass(frozen=True, slots=True)
class Outlook:
    """What one model offers one request now: where placement puts it, the seconds until it
    would be warm there, the request's wait budget (None: none), the model's context (None:
    unknown) and the prompt's estimated tokens, and the model's relay policy."""

    decision: Decision
    expected_wait: float = 0.0
    budget: float | None = None
    context: int | None = None
    prompt_tokens: int = 0
    relay: RelayPolicy = "off"


def too_long(prompt_tokens: int, context: int | None) -> bool:
    """Whether a prompt of about ``prompt_tokens`` surely passes ``context`` (rule 1)."""
    return bool(context) and prompt_tokens > (context or 0) * MARGIN


def refused_for_context(status: int, body: bytes) -> bool:
    """Whether an engine's answer (its status and the first bytes of its body) refuses the
    prompt as longer than its context."""
    if status != 400:
        return False
    text = body.decode("utf-8", "replace").lower()
    return any(words in text for words in PAST_CONTEXT)


def why_not(outlook: Outlook) -> Reason | None:
    """Why the model cannot serve the request (the rules above), or None when it can."""
    if too_long(outlook.prompt_tokens, outlook.context):
        return "context"
    decision = outlook.decision
    if isinstance(decision, Unavailable):
        if allows(outlook.relay, "error"):
            return None
        return "backoff" if decision.backing_off else "unavailable"
    if isinstance(decision, Serve | Full) or outlook.budget is None:
        return None
    if outlook.expected_wait > outlook.budget and not allows(outlook.relay, "slow"):
        return "wait_budget"
    return None


def first_able(
    fallbacks: Sequence[str],
    allowed: Callable[[str], bool],
    outlook: Callable[[str], Outlook | None],
) -> str | None:
    """The first of ``fallbacks`` the request's key may use (``allowed``) and that can serve it
    (its ``outlook``; None: the model does not exist now), or None."""
    for model in fallbacks:
        if not allowed(model):
            continue
        seen = outlook(model)
        if seen is not None and why_not(seen) is None:
            return model
    return None
