"""Each key's limits (docs/keys.md): requests per minute, tokens per minute and requests at once.

Tokens are known once an answer is over (its usage): a request is admitted while the tokens its
key spent in the last minute are under its ``tpm``, so requests in flight together may pass it
by what they spend; the next one waits for the minute to move on (429 with Retry-After).

A replica counts its own requests. Among replicas (Redis), the counts are the cluster's
(swapgate/cluster/key_counts.py): a request is admitted against the sum. When Redis does not
answer, each replica falls back to its own counts (fail open: the cluster may then admit up
to replicas × the limit) and says so once in the log.

The counts live as long as the gateway: a reload changes the limits, not what is in flight.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from swapgate.config.settings import KeyConfig
from swapgate.data.counts import PerSecond
from swapgate.errors import RateLimited

WINDOW = 60.0  # what rpm counts over, in seconds


Limit = Literal["rpm", "tpm", "concurrency"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """An admission's answer: admitted (``refused_by`` None: counted, a slot taken if its key
    has a concurrency), or the limit that refused it and the seconds until it would not."""

    refused_by: Limit | None
    wait: float = 0.0


ADMITTED = Verdict(None)


class SharedCounts(Protocol):
    """The cluster's counts (swapgate/cluster/key_counts.py); None: Redis gave no answer."""

    async def admit(
        self, name: str, rpm: int | None, tpm: int | None, concurrency: int | None
    ) -> Verdict | None:
        """Admit one request under every limit given, all at once or none."""

    async def settle(self, name: str, tokens: int, slot: bool) -> None:
        """A request is over: count the ``tokens`` it spent, give back its slot if ``slot``."""


@dataclass(slots=True)
class _Use:
    """One key's use on this replica: its arrivals in the last minute, at most its ``rpm``
    latest (what its limit reads), its requests in the last minute by the second, those in
    flight, and the tokens its answers spent in the last minute with their sum. Each admission
    drops what left the minute, so its cost and memory stay those of one minute's traffic."""

    arrivals: deque[float] = field(default_factory=deque)
    minute: PerSecond = field(default_factory=PerSecond)
    inflight: int = 0
    spent: deque[tuple[float, int]] = field(default_factory=deque)  # (when, tokens), a minute
    spent_total: int = 0  # the sum of ``spent``'s tokens

    def forget(self, now: float) -> None:
        """Drop the arrivals and tokens that left the last minute."""
        horizon = now - WINDOW
        while self.arrivals and self.arrivals[0] <= horizon:
            self.arrivals.popleft()
        while self.spent and self.spent[0][0] <= horizon:
            self.spent_total -= self.spent.popleft()[1]

    def tokens(self, now: float) -> int:
        """Tokens spent in the last minute."""
        self.forget(now)
        return self.spent_total

    def spend(self, now: float, tokens: int) -> None:
        self.spent.append((now, tokens))
        self.spent_total += tokens


@dataclass(frozen=True, slots=True)
class Admission:
    """A request admitted under its key's limits: ``release`` once it is answered."""

    name: str
    shared_slot: bool  # the slot was taken in the cluster's count, so it is given back there
    counts_tokens: bool = False  # its key has a tpm: what the answer spent is counted
    holds_slot: bool = False  # its key has a concurrency: its slot is given back

    @property
    def settles_at_end(self) -> bool:
        """Whether its release changes what the key's next request sees (a slot back, tokens
        counted): then it is released before its answer's end goes out, so that a client
        asking again at once, of any replica, sees it done."""
        return self.counts_tokens or self.holds_slot


class KeyLimits:
    def __init__(self, clock: Callable[[], float], shared: SharedCounts | None = None) -> None:
        self._clock = clock
        self._shared = shared
        self._use: dict[str, _Use] = {}
        self._settling: set[asyncio.Future[None]] = set()  # referenced until done

    async def admit(self, key: KeyConfig) -> Admission:
        """Admit a request of ``key``, or raise 429 ``rate_limited`` naming the key and the
        limit it is at. With replicas, the cluster's counts decide (one Redis script for all
        of the key's limits); this replica's own when Redis does not answer."""
        use = self._use.get(key.name) or self._use.setdefault(key.name, _Use())
        now = self._clock()
        use.forget(now)
        verdict = None
        limited = key.rpm is not None or key.tpm is not None or key.concurrency is not None
        if limited and self._shared is not None:
            verdict = await self._shared.admit(key.name, key.rpm, key.tpm, key.concurrency)
        shared_slot = verdict is not None and key.concurrency is not None
        if verdict is None:
            verdict = _own_verdict(key, use, now)
        if verdict.refused_by is not None:
            raise _refusal(key, verdict)
        if key.rpm is not None:
            if use.arrivals.maxlen != key.rpm:  # new, or its rpm changed with a reload
                use.arrivals = deque(use.arrivals, maxlen=key.rpm)
            use.arrivals.append(now)
        use.minute.add(now, WINDOW)
        use.inflight += 1
        return Admission(key.name, shared_slot, key.tpm is not None, key.concurrency is not None)

    async def release(self, admission: Admission, tokens: int = 0) -> None:
        """The request is over; ``tokens``: what it spent, as its engine reported. The
        cluster's count is settled even if the caller is cancelled meanwhile (its client went
        away as its answer ended): a slot never given back would stay taken."""
        use = self._use[admission.name]
        use.inflight = max(0, use.inflight - 1)
        tokens = tokens if admission.counts_tokens else 0
        if tokens > 0:
            use.spend(self._clock(), tokens)
        if self._shared is not None and (tokens > 0 or admission.shared_slot):
            settling = asyncio.ensure_future(
                self._shared.settle(admission.name, tokens, admission.shared_slot)
            )
            self._settling.add(settling)
            settling.add_done_callback(self._settling.discard)
            await asyncio.shield(settling)

    def describe(self) -> dict[str, dict[str, int]]:
        """Each key's use on this replica, for /admin/state."""
        now = self._clock()
        return {
            name: {
                "in_flight": use.inflight,
                "last_minute": use.minute.count(now, WINDOW),
                "tokens_last_minute": use.tokens(now),
            }
            for name, use in sorted(self._use.items())
        }


def _own_verdict(key: KeyConfig, use: _Use, now: float) -> Verdict:
    """The key's limits against this replica's own counts of its last minute."""
    if key.rpm is not None and len(use.arrivals) >= key.rpm:
        wait = use.arrivals[-key.rpm] + WINDOW - now  # when the rpm-th latest leaves the minute
        if wait > 0:
            return Verdict("rpm", wait)
    if key.tpm is not None and (total := use.tokens(now)) >= key.tpm:
        for when, tokens in use.spent:  # oldest first: until the rest are under tpm
            total -= tokens
            if total < key.tpm:
                return Verdict("tpm", when + WINDOW - now)
    if key.concurrency is not None and use.inflight >= key.concurrency:
        return Verdict("concurrency", 1.0)
    return ADMITTED


def _refusal(key: KeyConfig, verdict: Verdict) -> RateLimited:
    """429 ``rate_limited``: the key, the limit it is at, and when to retry."""
    seconds = max(1, math.ceil(verdict.wait))
    if verdict.refused_by == "concurrency":
        return RateLimited(
            f"the key {key.name!r} is at its limit of {key.concurrency} requests at once; "
            "retry when one of them ends",
            retry_after=1,
        )
    if verdict.refused_by == "rpm":
        past = f"is at its limit of {key.rpm} requests per minute"
    else:
        past = f"spent its {key.tpm} tokens per minute"
    return RateLimited(f"the key {key.name!r} {past}; retry in {seconds}s", retry_after=seconds)
