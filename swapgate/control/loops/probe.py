"""The relay as a control (docs/operations.md, "Is the decay local?"): every ``probe_interval`` of a
relay, one tiny streamed prompt to each warm model that falls back to it, and the same to the
relay; both times to first token go side by side (``swapgate_probe_ttft_seconds``). Off unless
a relay sets ``probe_interval``.

A probe to an instance takes a lease like a request (it counts in flight, waits for nothing and
starts no swap: a model not warm, or with no free slot, is skipped this round). Probes are
counted in ``swapgate_probe_requests_total`` only, never as clients' requests.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from swapgate.config.settings import RelayConfig, Settings
from swapgate.control.loops.decay import DecayWatch
from swapgate.control.routing.router import Router
from swapgate.control.routing.waiter import Routing
from swapgate.data.lease import Upstream
from swapgate.metrics import Metrics
from swapgate.policy.placement import Serve

log = logging.getLogger("swapgate.probe")
PROMPT = [{"role": "user", "content": "Say OK."}]
TIMEOUT = 60.0


class Prober:
    def __init__(
        self,
        settings: Settings,
        router: Router,
        decay: DecayWatch,
        metrics: Metrics,
        client: httpx.AsyncClient,
    ) -> None:
        self._settings = settings
        self._router = router
        self._decay = decay
        self._metrics = metrics
        self._client = client

    @property
    def wanted(self) -> bool:
        return any(r.probe_interval for r in self._settings.relays.values())

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for name, relay in self._settings.relays.items():
                if relay.probe_interval:
                    group.create_task(self._every(name, relay), name=f"probe {name}")

    async def _every(self, name: str, relay: RelayConfig) -> None:
        assert relay.probe_interval is not None
        while True:
            await self.round(name)
            await asyncio.sleep(relay.probe_interval)

    async def round(self, relay: str) -> None:
        """Probe each warm model whose relay is ``relay`` and, at the same moment, the relay."""
        upstream = self._router.relays.upstream(relay)
        for model, conf in self._settings.models.items():
            if conf.relay != relay:
                continue
            to_relay = self._probe(f"relay/{relay}", upstream, conf.relay_model or model)
            decision = self._router.place(model, Routing(), time.monotonic())
            if not isinstance(decision, Serve):
                await to_relay
                continue
            lease = self._router.lease(decision.instance, model, None)
            try:
                target = f"instance/{lease.name}"
                await asyncio.gather(
                    self._probe(target, lease.upstream, lease.upstream_model), to_relay
                )
            finally:
                self._router.release(lease)

    async def _probe(self, target: str, upstream: Upstream, model: str) -> None:
        body = {"model": model, "messages": PROMPT, "max_tokens": 1, "stream": True}
        headers = {"authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        url = upstream.url_for("/v1/chat/completions") + (
            f"?{upstream.query}" if upstream.query else ""
        )
        started = time.perf_counter()
        try:
            async with self._client.stream(
                "POST", url, json=body, headers=headers, timeout=TIMEOUT
            ) as answer:
                if answer.status_code != 200:
                    raise httpx.HTTPStatusError(
                        f"answered {answer.status_code}", request=answer.request, response=answer
                    )
                async for line in answer.aiter_lines():
                    if line.startswith("data:"):
                        break
                ttft = time.perf_counter() - started
        except httpx.HTTPError as exc:
            self._metrics.probes.labels(target, "error").inc()
            log.warning("probe of %s (%s) failed: %s", target, model, exc)
            return
        self._metrics.probes.labels(target, "ok").inc()
        self._metrics.probe_ttft.labels(target).observe(ttft)
        self._decay.probe(target, ttft)
