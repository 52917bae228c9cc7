"""One request's tries (docs/architecture.md, "Failover"): the instance the router leased, then
where swapgate/policy/retry.py says a failure before any byte reached the client goes next:
another instance that has the model warm, the model's relay if its relay policy allows
``error``, the same instance once more, swapgate's queue, or placed again as a cold request
when its instance is down. Nothing is tried again once bytes went out.

``Attempts`` holds the one lease a request has at any time and gives it back exactly once, so
the data plane never releases leases itself. When the swap its first lease waited for fails,
``instead`` may name another model of the request's ``fallbacks`` that answers it
(docs/configuration.md, "Fallback models"): the tries go on for that one; the same when an
engine refuses a prompt as past its context (``Attempts.instead``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from swapgate.control.routing.router import Router
from swapgate.control.routing.waiter import Routing
from swapgate.data.lease import Lease, Progress
from swapgate.errors import NoCapacity, SwapFailed
from swapgate.policy import retry
from swapgate.policy.retry import Failure, Next, Outcome

# After a failed swap: the model that answers instead and the request's Routing for it, or None
Instead = Callable[[], tuple[str, Routing] | None]


class Attempts:
    def __init__(
        self,
        router: Router,
        model: str,
        routing: Routing | None = None,
        instead: Instead | None = None,
    ) -> None:
        self._router = router
        self._instead = instead
        self._model = model
        self._routing = routing  # its pool and wait budget: another instance is of the same pool
        self._used: set[Next] = set()  # each place is tried once (the queue: within max_wait)
        self._limited_since: float | None = None  # when an instance first said 429 to it
        self.lease: Lease | None = None
        # Open for its client until ``release``, in flight while it holds a lease
        self._ticket = router.clients.began(routing.client if routing else None, model)

    async def first(self, progress: Progress) -> Lease:
        try:
            self.lease = await self._router.acquire(self._model, progress, self._routing)
        except SwapFailed:
            other = self._instead() if self._instead is not None else None
            if other is None:
                raise
            self._switch(*other)
            self.lease = await self._router.acquire(self._model, progress, self._routing)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    async def instead(self, progress: Progress, model: str, routing: Routing) -> Lease:
        """The current lease's engine refused the request as one its model cannot serve (its
        prompt past the context): give the lease back and try ``model``, which answers it
        instead, from its first lease on."""
        if self.lease is not None:
            self._router.release(self.lease)
            self.lease = None
        self._switch(model, routing)
        self._used.clear()  # another model: its own places to try
        self.lease = await self._router.acquire(model, progress, routing)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    def _switch(self, model: str, routing: Routing) -> None:
        """From here on the request is one for ``model`` (it holds no lease yet)."""
        clients = self._router.clients
        clients.ended(self._ticket)
        self._model, self._routing = model, routing
        self._ticket = clients.began(routing.client, model)

    def after(self, failure: Failure, held: float, resendable: bool) -> Next | None:
        """The current lease failed with ``failure`` after holding the request ``held`` s: take
        the next place the retry rule names and this request has not used (the lease it holds
        then is ``lease``), or None, and the failure is the answer (the failed lease stays
        held). ``Next.WAIT`` and ``Next.PLACE`` are not taken here: the caller lets the answer
        go, then awaits ``wait_for_room`` or ``place_again``."""
        failed = self.lease
        assert failed is not None
        outcome = Outcome(failure, held, resendable, failed.kind == "relay")
        for place in retry.after(outcome):
            if place is Next.WAIT:
                return place
            if place is Next.PLACE:
                if place in self._used:
                    continue
                self._used.add(place)
                return place
            taken = self._take(place, failed) if place not in self._used else None
            if taken is not None:
                self._used.add(place)
                if taken is not failed:
                    self._router.release(failed)
                self.lease = taken
                return place
        return None

    def _take(self, place: Next, failed: Lease) -> Lease | None:
        match place:
            case Next.OTHER:
                return self._router.acquire_warm(
                    self._model, besides=failed.name, routing=self._routing
                )
            case Next.RELAY:
                return self._router.relay(self._model, "error")
            case _:  # the same instance once more; its wait is counted already
                return replace(failed, waited=0.0)

    async def place_again(self, progress: Progress) -> Lease:
        """The current lease's instance refused the connection (it is down now): give the
        lease back and place the request again as a cold one, within its wait budget."""
        down = self.lease
        assert down is not None
        self._router.release(down)
        self.lease = None
        self._router.clients.flying(self._ticket, False)
        self.lease = await self._router.acquire(self._model, progress, self._routing)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    async def wait_for_room(self, progress: Progress, pause: float) -> Lease:
        """The current lease's instance refused it for its own concurrency limit (a 429):
        give it back and wait in swapgate's queue for a slot there or another warm copy,
        within the model's ``max_wait`` from the first refusal; ``pause``: the instance's
        ``Retry-After``, waited when nothing else of swapgate's is in flight there."""
        limited = self.lease
        assert limited is not None
        clock = self._router.clock
        since = self._limited_since = self._limited_since or clock()
        max_wait = self._router.max_wait(self._model)
        self.lease = None
        self._router.clients.flying(self._ticket, False)
        if not self._router.refused_for_limit(limited):
            await asyncio.sleep(pause)
        if clock() - since > max_wait:
            raise NoCapacity(
                f"{limited.name} kept refusing {self._model!r} for its concurrency limit for "
                f"{max_wait:g}s (max_wait); retry later",
                retry_after=max(1, round(pause)),
            )
        self.lease = await self._router.acquire(self._model, progress, self._routing)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    def release(self) -> None:
        """Give the lease back (once), and close the request for its client."""
        if self.lease is not None:
            self._router.release(self.lease)
            self.lease = None
        self._router.clients.ended(self._ticket)
