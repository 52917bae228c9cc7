"""Other replicas' requests in flight (docs/deploy.md, several replicas), as their heartbeats
tell them: snapshots add them to this replica's own, so placement sees the cluster's load."""

from __future__ import annotations

REPLICA_TTL = 3.0  # a replica unheard this long has nothing in flight any more


class PeerLoad:
    def __init__(self) -> None:
        # replica -> (heard at, instance -> model -> count)
        self._heard: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}
        self._total: dict[str, dict[str, int]] = {}  # instance -> model -> count, all of them

    def heard(self, replica: str, counts: dict[str, dict[str, int]], now: float) -> None:
        """``replica`` has ``counts`` in flight; replicas unheard for ``REPLICA_TTL`` drop."""
        self._heard[replica] = (now, counts)
        self._heard = {r: v for r, v in self._heard.items() if now - v[0] <= REPLICA_TTL}
        total: dict[str, dict[str, int]] = {}
        for _, seen in self._heard.values():
            for name, models in seen.items():
                into = total.setdefault(name, {})
                for model, count in models.items():
                    into[model] = into.get(model, 0) + int(count)
        self._total = total

    def on(self, instance: str) -> dict[str, int] | None:
        """What the other replicas have in flight on ``instance``, per model."""
        return self._total.get(instance)
