"""What a swap asks of the other replicas around it (docs/deploy.md, "Several replicas"): may it
run, who is told how it ended and what it evicted, and whether this replica puts what is over
capacity to sleep. A replica alone asks nobody (``SingleReplica``); among replicas on Redis,
swapgate/cluster/swaps.py's ``SharedClaims`` answers, and the coordinator is given it when it
is made."""

from __future__ import annotations

from typing import Protocol


class Claims(Protocol):
    # Whether a swap nobody here waits for any more may be abandoned: among replicas, requests
    # other replicas hand to a swap here are not counted here
    abandons: bool

    async def claim(self, instance: str, model: str) -> bool:
        """Whether this swap may run; False once it was handed to another replica's."""
        ...

    async def released(self, instance: str, model: str) -> None:
        """The swap ended (the registry knows how)."""
        ...

    async def may_trim(self) -> bool:
        """Whether this replica puts what is awake beyond capacity to sleep."""
        ...

    def evicted(self, instance: str, model: str) -> None:
        """``model`` left ``instance``."""
        ...


class SingleReplica:
    """A replica alone: every swap may run, it trims, and nobody else is told anything."""

    abandons = True

    async def claim(self, instance: str, model: str) -> bool:
        return True

    async def released(self, instance: str, model: str) -> None:
        return None

    async def may_trim(self) -> bool:
        return True

    def evicted(self, instance: str, model: str) -> None:
        return None
