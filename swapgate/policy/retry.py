"""What comes after a try that failed before any byte reached the client (docs/architecture.md,
"Failover"): one rule, from what happened to where the request goes next.

What happened is one ``Outcome``; the answer is the places to try, in order, of which the
request takes the first it has not used up (``Attempts`` in swapgate/control/routing/failover.py
applies it). Every request is sent at most once to another copy, once more to the same one,
once to its model's relay, and placed again once, as a cold request, when its instance refused
the connection (it is down: the request waits for a swap elsewhere, its queue or its relay,
never a 502 while another instance could hold its model); nothing is tried again once bytes
went out.

The one question the rule cannot skip: did the upstream perhaps *run* the request? A connection
that closed with no answer, or a 502/503 with no body, is what a proxy in front of an engine
(llama-swap) answers both for a kept-alive connection closed under it, when the engine never saw
the request, and for an engine that crashed in the middle of it. The first takes milliseconds; a
request held longer than ``MAY_HAVE_RUN`` may be what crashed its engine, and is never sent to
another instance, nor again to its own: a poison request takes one instance down, not all.
A reset is the exception: a socket resets when it closes with bytes unread, so the upstream
never read the whole request, however long that took to show (a proxy's loop busy with a
thousand streams can take seconds to see a reset that came at once).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Seconds an upstream can hold a request that fails by its connection alone: past them a
# bodiless failure may come from running it
MAY_HAVE_RUN = 1.0


class Failure(enum.Enum):
    REFUSED = "refused"  # nothing listens: it never reached the upstream
    KEY = "key"  # 401/403: the upstream refused swapgate's key for it
    LIMITED = "limited"  # 429: the instance's own concurrency limit
    CLOSED = "closed"  # the connection closed with no answer
    UNREAD = "unread"  # it was reset: the upstream never read the request
    BODILESS = "bodiless"  # a 502 or 503 with no body: a proxy saying its engine failed
    REFUSAL = "refusal"  # a 502 or 503 with a body: an engine alive, saying why it will not


class Next(enum.Enum):
    OTHER = "other"  # another instance that has the model warm
    RELAY = "relay"  # the model's relay, if its relay policy allows ``error``
    SAME = "same"  # the same instance once more
    WAIT = "wait"  # swapgate's queue, for room there or on another copy (backpressure)
    PLACE = "place"  # placed again as a cold request: its instance is down (a swap elsewhere)


@dataclass(frozen=True, slots=True)
class Outcome:
    failure: Failure
    held: float  # seconds from sending the request to the failure
    resendable: bool  # its body can be sent again (not an upload already streamed)
    to_relay: bool = False  # the failed try went to a relay


def after(outcome: Outcome) -> tuple[Next, ...]:
    """Where a request goes after ``outcome``, in order of preference; none: its failure is
    the answer."""
    if not outcome.resendable or outcome.to_relay:
        return ()
    match outcome.failure:
        case Failure.LIMITED:
            return (Next.WAIT,)
        case Failure.REFUSED:
            # Nothing listens there: it never reached the instance, which is down from now on
            return (Next.OTHER, Next.PLACE)
        case Failure.KEY:
            return (Next.OTHER, Next.RELAY)
        case Failure.REFUSAL:
            return (Next.OTHER, Next.RELAY, Next.SAME)
        case Failure.UNREAD:
            return (Next.SAME, Next.OTHER, Next.RELAY)
        case Failure.CLOSED | Failure.BODILESS if outcome.held < MAY_HAVE_RUN:
            # A kept-alive connection closed under it: the engine is there, and never ran it
            return (Next.SAME, Next.OTHER, Next.RELAY)
    return ()
