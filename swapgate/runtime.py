"""The Runtime owns every live object of a running gateway and closes them in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from swapgate.catalog import Catalog
from swapgate.config import Settings, secret
from swapgate.drivers import make_driver
from swapgate.metrics import Metrics
from swapgate.poller import Poller
from swapgate.proxy.handler import ClientAuth, ProxyEndpoint
from swapgate.proxy.upstream import UpstreamClient
from swapgate.registry import Registry
from swapgate.router import Router
from swapgate.swaps import SwapCoordinator, SwapTimes

log = logging.getLogger("swapgate")


class Runtime:
    """Built from validated settings without I/O; ``start`` connects, ``aclose`` tears down."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.catalog = Catalog(settings)
        self.registry = Registry(settings.instances, self.catalog)
        self.metrics = Metrics()
        self.metrics.watch(self.registry)
        self._control = httpx.AsyncClient()
        self.drivers = {inst.name: make_driver(inst, self._control) for inst in settings.instances}
        self.coordinator = SwapCoordinator(
            self.registry,
            self.drivers,
            self.catalog,
            SwapTimes(settings.routing.expected_swap),
            self.metrics,
            settings.routing.swap_timeout,
        )
        self.router = Router(settings, self.registry, self.coordinator, self.catalog, self.metrics)
        self.poller = Poller(
            self.registry, self.drivers, self.metrics, settings.routing.poll_interval
        )
        self.upstream = UpstreamClient(settings.routing.stream_idle_timeout)
        self.auth = ClientAuth(_split_keys(secret(settings.server.api_keys_env)))
        self.started = False
        self._poll_task: asyncio.Task[None] | None = None

    def proxy_endpoint(self) -> ProxyEndpoint:
        return ProxyEndpoint(
            router=self.router,
            registry=self.registry,
            catalog=self.catalog,
            client=self.upstream,
            metrics=self.metrics,
            auth=self.auth,
            keepalive=self.settings.keepalive_for,
            max_body_bytes=self.settings.server.max_body_bytes,
            access_log=self.settings.server.access_log,
        )

    async def start(self) -> None:
        await self.upstream.start()
        await self.poller.poll_all()
        self._poll_task = asyncio.create_task(self.poller.run(), name="poller")
        self.started = True
        up = [name for name in self.registry.names() if self.registry.is_up(name)]
        log.info("swapgate started: %d of %d instances up", len(up), len(self.drivers))
        for warning in unsupported_settings(self.settings):
            log.warning("%s", warning)

    async def aclose(self) -> None:
        self.started = False
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
        await self.coordinator.aclose()
        await self.upstream.aclose()
        await self._control.aclose()


def unsupported_settings(settings: Settings) -> list[str]:
    """Configured features this release validates but does not act on yet."""
    warnings = []
    if settings.preloads:
        names = [job.name for job in settings.preloads]
        warnings.append(f"scheduled preloads are not implemented in this release; ignored: {names}")
    return warnings


def _split_keys(value: str | None) -> list[str]:
    return [key.strip() for key in (value or "").split(",") if key.strip()]
