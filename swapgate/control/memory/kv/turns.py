"""The engine slot a turn of a conversation goes to (docs/kv-keep.md): on a ``kv_keep``
instance, the lease a turn goes out on names the slot swapgate handed it (``id_slot``), its
saved KV restored there first; the slot is given back when the turn ends. A request that is
no turn of a conversation, or goes elsewhere, awaits nothing here."""

from __future__ import annotations

from dataclasses import replace

from swapgate.control.memory.kv.book import Claim
from swapgate.control.memory.kv.keeper import KvKeeper
from swapgate.data.lease import Lease


class TurnSlots:
    """The data plane's way to ``KvKeeper``'s slots, one lease at a time."""

    def __init__(self, kv: KvKeeper | None) -> None:
        self._kv = kv

    def keeps(self, lease: Lease, conversation: str | None) -> bool:
        """Whether a turn of ``conversation`` on ``lease`` goes to a slot swapgate hands out."""
        kv = self._kv
        return (
            conversation is not None
            and kv is not None
            and lease.kind == "instance"
            and kv.keeps(lease.name)
        )

    async def claim(
        self, lease: Lease, conversation: str | None, tenant: str | None
    ) -> tuple[Lease, Claim | None]:
        """``lease`` with the slot its turn of ``conversation`` (of client key ``tenant``) goes
        to, and the claim to give back with ``free``; the lease as it is where none is kept."""
        kv = self._kv
        if kv is None or conversation is None or not self.keeps(lease, conversation):
            return lease, None
        key = lease.upstream.api_key
        auth = {"authorization": f"Bearer {key}"} if key else {}
        server = kv.server(lease.name, lease.upstream.url, lease.upstream_model, auth)
        claim = await kv.prepare(lease.name, lease.model, conversation, tenant, server)
        return replace(lease, slot=claim.slot if claim is not None else None), claim

    async def free(self, claim: Claim | None) -> None:
        """The turn sent to ``claim``'s slot ended (or goes to another attempt)."""
        if claim is not None and self._kv is not None:
            await self._kv.finish(claim)
