"""One request's tries (docs/architecture.md): the instance the router leased, then, after a failure
before any byte reached the client, one other instance that has the model warm, then the model's
relay if its fallback policy allows ``error``; after a 502 or 503 with neither, the same instance
once more. Nothing is tried again once bytes went out.

``Attempts`` holds the one lease a request has at any time and gives it back exactly once, so
the data plane never releases leases itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from swapgate.control.router import Router
from swapgate.control.waiter import Want
from swapgate.data.lease import Lease, Progress
from swapgate.errors import NoCapacity


class Attempts:
    def __init__(self, router: Router, model: str, want: Want | None = None) -> None:
        self._router = router
        self._model = model
        self._want = want  # its pool and wait budget: another instance is of the same pool
        self._retried = False  # another instance was tried already: next is the relay
        self._again = False  # the same instance was tried once more already
        self._limited_since: float | None = None  # when an instance first said 429 to it
        self.lease: Lease | None = None
        # Open for its client until ``release``, in flight while it holds a lease
        self._ticket = router.clients.began(want.client if want else None, model)

    async def first(self, progress: Progress) -> Lease:
        self.lease = await self._router.acquire(self._model, progress, self._want)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    def next(self) -> Lease | None:
        """After the current lease failed before any byte reached the client: give it back
        and take the next one, if there is one (else the failed lease stays held)."""
        failed = self.lease
        if failed is None or failed.kind == "relay":
            return None
        other = None
        if not self._retried:
            other = self._router.acquire_warm(self._model, besides=failed.name, want=self._want)
        other = other or self._router.relay(self._model, "error")
        if other is None:
            return None
        self._router.release(failed)
        self.lease, self._retried = other, True
        return other

    def again(self) -> Lease | None:
        """After a 502 or 503 from the current lease's instance, with nowhere else to go:
        the same instance once more. The proxy in front of an engine (llama-swap) answers 502
        when its kept-alive connection to the engine was closed under it: the engine never saw
        the request, and the next one finds it there."""
        lease = self.lease
        if lease is None or lease.kind != "instance" or self._again:
            return None
        self._again = True
        self.lease = replace(lease, waited=0.0)  # its wait is counted already
        return self.lease

    async def after_limit(self, progress: Progress, pause: float) -> Lease:
        """The current lease's instance refused it for its own concurrency limit (a 429):
        give it back and wait in swapgate's queue for a slot there or another warm copy,
        within the model's ``max_wait`` from the first refusal; ``pause``: the instance's
        ``Retry-After``, waited when nothing else of swapgate's is in flight there."""
        limited = self.lease
        assert limited is not None
        now = time.monotonic()
        since = self._limited_since = self._limited_since or now
        max_wait = self._router.max_wait(self._model)
        self.lease = None
        self._router.clients.flying(self._ticket, False)
        if not self._router.limited(limited):
            await asyncio.sleep(pause)
        if time.monotonic() - since > max_wait:
            raise NoCapacity(
                f"{limited.name} kept refusing {self._model!r} for its concurrency limit for "
                f"{max_wait:g}s (max_wait); retry later",
                retry_after=max(1, round(pause)),
            )
        self.lease = await self._router.acquire(self._model, progress, self._want)
        self._router.clients.flying(self._ticket, True)
        return self.lease

    def release(self) -> None:
        """Give the lease back (once), and close the request for its client."""
        if self.lease is not None:
            self._router.release(self.lease)
            self.lease = None
        self._router.clients.ended(self._ticket)
