"""The live state the registry's parts share: every instance's ``InstanceSlot``, the catalog
that names their models, the one clock and the change signal (docs/architecture.md, "Wiring").

The registry owns it and reads it; each part that changes it is used by one caller (the poller,
the swap coordinator, the data plane, operators) and wakes the waiters through ``changes``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from swapgate.config.catalog import Catalog
from swapgate.control.state.changes import Changes
from swapgate.control.state.queues import Queues
from swapgate.control.state.slots import InstanceSlot


@dataclass(eq=False)
class LiveState:
    instances: dict[str, InstanceSlot]  # replaced whole by a reload: read it through here
    catalog: Catalog
    clock: Callable[[], float]
    changes: Changes
    queues: Queues  # arrivals, and the requests waiting now
    known: frozenset[str] | None = None  # every model known; None: to be computed again
    # The instances serving each model, in the config's order; None: to be computed again
    serving: dict[str, list[str]] | None = None

    def client_name(self, instance: str, upstream: str) -> str:
        return self.catalog.client_name(instance, upstream)

    def served_changed(self) -> None:
        """What some instance serves changed (a poll that discovers them, a reload): what is
        known of it is computed again when next asked."""
        self.known = self.serving = None
