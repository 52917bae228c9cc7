"""The external relays a model may be answered by (docs/operations.md, "Relay fallback"), as
leases the data plane sends to."""

from __future__ import annotations

from collections.abc import Callable

from swapgate.config.settings import Settings, secret
from swapgate.data.lease import Lease, Upstream
from swapgate.metrics import Metrics
from swapgate.policy.relay import Reason, allows


class Relays:
    def __init__(self, settings: Settings, clock: Callable[[], float], metrics: Metrics) -> None:
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._upstreams = {
            name: Upstream(
                relay.url,
                secret(relay.api_key_env),
                True,
                relay.timeout,
                relay.api_key_env,
                frozenset(relay.protocols),
            )
            for name, relay in settings.relays.items()
        }

    def lease(self, model: str, reason: Reason, started: float | None = None) -> Lease | None:
        """Lease the model's relay if its relay policy allows ``reason``."""
        conf = self._settings.model_settings(model)
        if conf.relay is None or not allows(conf.relay_policy, reason):
            return None
        self._metrics.fallbacks.labels(model, conf.relay, reason).inc()
        waited = self._clock() - started if started is not None else 0.0
        upstream_model = conf.relay_model or model
        return Lease(
            "relay", conf.relay, model, upstream_model, self._upstreams[conf.relay], waited
        )

    def upstream(self, name: str) -> Upstream:
        """Where the relay ``name`` is, with its key: for the decay probe
        (control/loops/probe.py)."""
        return self._upstreams[name]
