"""The one retry rule (swapgate/policy/retry.py): what happened, to where a request goes next."""

from __future__ import annotations

import pytest

from swapgate.policy.retry import MAY_HAVE_RUN, Failure, Next, Outcome, after

QUICK, SLOW = 0.01, MAY_HAVE_RUN + 2.0
OTHER, RELAY, SAME, WAIT, PLACE = Next.OTHER, Next.RELAY, Next.SAME, Next.WAIT, Next.PLACE


@pytest.mark.parametrize(
    ("outcome", "places"),
    [
        # It never reached the upstream (down): another warm copy, else placed again as cold
        (Outcome(Failure.REFUSED, QUICK, True), (OTHER, PLACE)),
        (Outcome(Failure.KEY, QUICK, True), (OTHER, RELAY)),
        # An engine alive that said why (a 503 "loading"): elsewhere, else here once more
        (Outcome(Failure.REFUSAL, SLOW, True), (OTHER, RELAY, SAME)),
        # The instance's own concurrency limit: backpressure in swapgate's queue
        (Outcome(Failure.LIMITED, QUICK, True), (WAIT,)),
        (Outcome(Failure.LIMITED, SLOW, True), (WAIT,)),
        # Closed or bodiless at once: a kept-alive connection closed under it, the engine never
        # ran it: the same instance, else elsewhere
        (Outcome(Failure.CLOSED, QUICK, True), (SAME, OTHER, RELAY)),
        (Outcome(Failure.BODILESS, QUICK, True), (SAME, OTHER, RELAY)),
        # ...but after holding it, it may be what crashed the engine: nowhere, not even back
        (Outcome(Failure.CLOSED, SLOW, True), ()),
        (Outcome(Failure.BODILESS, SLOW, True), ()),
        (Outcome(Failure.CLOSED, MAY_HAVE_RUN, True), ()),
        # A reset: the upstream never read the request, however late the proxy saw it
        (Outcome(Failure.UNREAD, QUICK, True), (SAME, OTHER, RELAY)),
        (Outcome(Failure.UNREAD, SLOW, True), (SAME, OTHER, RELAY)),
        (Outcome(Failure.UNREAD, SLOW, False), ()),
        # A body that cannot be sent again (an upload already streamed), or a relay: the answer
        (Outcome(Failure.REFUSED, QUICK, False), ()),
        (Outcome(Failure.REFUSAL, QUICK, False), ()),
        (Outcome(Failure.LIMITED, QUICK, False), ()),
        (Outcome(Failure.REFUSAL, QUICK, True, to_relay=True), ()),
        (Outcome(Failure.REFUSED, QUICK, True, to_relay=True), ()),
    ],
)
def test_where_a_request_goes_after_a_failure(outcome: Outcome, places: tuple[Next, ...]) -> None:
    assert after(outcome) == places
