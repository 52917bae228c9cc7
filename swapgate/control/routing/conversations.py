"""Where each conversation was served last, and the copy its next turn goes back to (prefix
affinity, docs/operations.md; a ``kv_keep`` instance's slots, docs/kv-keep.md)."""

from __future__ import annotations

from collections import OrderedDict

from swapgate.config.settings import Settings
from swapgate.control.state.registry import Registry
from swapgate.data.lease import Lease
from swapgate.data.snapshot import Snapshot
from swapgate.metrics import Metrics
from swapgate.policy import affinity
from swapgate.policy.placement import Policy, Serve, open_copies

CONVERSATIONS_KEPT = 10_000  # (model, conversation) pairs remembered for prefix affinity


class Conversations:
    def __init__(
        self, settings: Settings, registry: Registry, policy: Policy, metrics: Metrics
    ) -> None:
        self._registry = registry
        self._policy = policy
        self._metrics = metrics
        self._slack = settings.routing.affinity_slack
        self._kv_keep = frozenset(i.name for i in settings.instances if i.kv_keep is not None)
        # (model, conversation) -> the copy that served it last
        self._served: OrderedDict[tuple[str, str], str] = OrderedDict()

    def matter(self, model: str) -> bool:
        """Whether a request's conversation can change where it goes: ``model`` is served by a
        ``kv_keep`` instance, or by two or more instances among which prefix affinity chooses.
        Else its identity is not worth computing (docs/kv-keep.md)."""
        serving = self._registry.instances_of(model)
        if self._kv_keep.intersection(serving):
            return True
        return bool(self._slack) and len(serving) > 1

    def steer(self, model: str, key: str | None, snap: Snapshot, decision: Serve) -> Serve:
        """The warm copy that served this conversation last, whose engine holds its prompt's
        KV cache, unless it is busier than ``routing.affinity_slack`` allows
        (swapgate/policy/affinity.py)."""
        copies = open_copies(model, snap, self._policy)
        if key is None or self._slack <= 0 or len(copies) < 2:
            return decision
        last = self._served.get((model, key))
        target, result = affinity.choose(last, copies, decision.instance, self._slack)
        self._metrics.affinity.labels(result).inc()
        return Serve(target)

    def remember(self, model: str, conversation: str | None, lease: Lease) -> None:
        """Where this conversation was served: the copy its next turn goes back to."""
        if conversation is None or lease.kind != "instance":
            return
        key = (model, conversation)
        self._served[key] = lease.name
        self._served.move_to_end(key)
        if len(self._served) > CONVERSATIONS_KEPT:
            self._served.popitem(last=False)
