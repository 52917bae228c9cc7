"""The relay policy: when a request goes to the relay instead of waiting, a pure function of
the model's `fallback` key (its name in the config is older than the word "relay policy").

Policies, each including the ones before it (docs/configuration.md):
  off    never relays: the data stays on the premises;
  error  relays when no instance can serve (all down, swap failed, queue full, max_wait passed);
  slow   also when the expected wait (swap ETA + what is ahead) exceeds the model's max_wait;
  swap   also every request that would have to wait for a swap at all; the swap still runs.
"""

from __future__ import annotations

from typing import Literal

from swapgate.config.settings import RelayPolicy
from swapgate.policy.placement import Decision, Full, Serve, Unavailable

Reason = Literal["swap", "slow", "error", "queue_full"]
_RANK: dict[str, int] = {"off": 0, "error": 1, "slow": 2, "swap": 3}
_NEEDS: dict[Reason, int] = {"error": 1, "queue_full": 1, "slow": 2, "swap": 3}


def allows(policy: RelayPolicy, reason: Reason) -> bool:
    return _RANK[policy] >= _NEEDS[reason]


def relay_reason(
    policy: RelayPolicy, decision: Decision, expected_wait: float, max_wait: float
) -> Reason | None:
    """Why a request placed as ``decision`` goes to the relay now, or None when it stays."""
    if isinstance(decision, Serve | Full):  # warm: a slot frees as soon as a request ends
        return None
    if isinstance(decision, Unavailable):
        return "error" if allows(policy, "error") else None
    if allows(policy, "swap"):
        return "swap"
    if allows(policy, "slow") and expected_wait > max_wait:
        return "slow"
    return None
