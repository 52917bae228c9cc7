"""vLLM's sleep mode (docs/configuration.md ``vllm-sleep``): one GPU, a vLLM server per model, all
but
``capacity`` of them asleep.

Each server runs with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``, which exposes
``POST /sleep?level=N&mode=M``, ``POST /wake_up[?tags=T]``, ``GET /is_sleeping``
(``{"is_sleeping": bool}``) and ``POST /collective_rpc`` (vLLM's docs/features/sleep_mode.md and
``vllm/entrypoints/serve/dev/``). Level 1 moves the weights to CPU RAM and drops the KV cache: a
wake takes seconds. Level 2 drops the weights too: a wake gives their memory back, and the
weights are read again from disk (``collective_rpc`` ``reload_weights``) before the rest wakes,
still without starting the process. Asleep is its own state (``WarmState.ASLEEP``): placement
prefers waking a sleeping copy to loading a cold one when that is sooner.

What the real server does (docs/compatibility.md, note 6): it starts awake, and holds a request
that reaches it asleep until its next wake.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import LOAD_TIMEOUT, POLL_TIMEOUT, Driver
from swapgate.errors import DriverError

# A wake answers once the engine is awake; this long after it, the server must say so.
AWAKE_CHECKS, AWAKE_PAUSE = 50, 0.1


class VllmSleepDriver(Driver):
    kind = "vllm-sleep"

    evicts_to = WarmState.ASLEEP
    # Each server starts awake (and is awake again after a restart, or a wake by hand):
    # swapgate puts those beyond the capacity to sleep, least wanted first.
    trims_to_capacity = True

    def __init__(
        self,
        servers: Mapping[str, str],
        level: int,
        client: httpx.AsyncClient,
        api_key: str | None = None,
    ) -> None:
        super().__init__(next(iter(servers.values())), client, api_key, discover=False)
        self._servers = dict(servers)
        self._level = level
        # The level each server was put to sleep at here; one found asleep is taken to be
        # at the configured level.
        self._slept: dict[str, int] = {}

    def model_url(self, model: str) -> str | None:
        return self._servers.get(model)

    async def state(self) -> InstanceReport:
        """Each server's ``/is_sleeping``. One that does not answer is down alone (its model
        is cold and unreachable: nothing is put to sleep for it); all of them: the instance."""
        answers = await asyncio.gather(
            *(self._sleeping(url) for url in self._servers.values()), return_exceptions=True
        )
        running: dict[str, WarmState] = {}
        unreachable: dict[str, str] = {}
        for (model, url), answer in zip(self._servers.items(), answers, strict=True):
            if isinstance(answer, bool):
                running[model] = WarmState.ASLEEP if answer else WarmState.WARM
            else:
                unreachable[model] = f"its vLLM server {_where(url)} does not answer"
        if not running:
            raise DriverError("no vLLM server of this instance answers GET /is_sleeping")
        return InstanceReport(running=running, available=None, unreachable=unreachable)

    async def check_loadable(self, model: str) -> None:
        """Before anything is put to sleep for ``model``: its server must answer."""
        await self._sleeping(self._server(model))

    async def load(self, model: str) -> None:
        """Wake ``model``'s server and wait until it says it is awake (the coordinator put
        the ones it replaces to sleep first). Until then no request may reach it: a sleeping
        vLLM holds a request, silent, until its next wake."""
        url = self._server(model)
        if not await self._sleeping(url):
            return  # awake already (woken by someone else, or never asleep)
        if self._slept.pop(url, self._level) == 2:
            # Level 2 dropped the weights: a plain wake gives their memory back, not their
            # values. Wake the weights, read them again from disk, then wake the rest.
            await self._post(url, "/wake_up?tags=weights")
            await self._post(url, "/collective_rpc", {"method": "reload_weights"})
        await self._post(url, "/wake_up")
        for _ in range(AWAKE_CHECKS):
            if not await self._sleeping(url):
                return
            await asyncio.sleep(AWAKE_PAUSE)
        raise DriverError(f"{url} still sleeps after POST /wake_up")

    async def unload(self, model: str) -> None:
        """Put ``model``'s server to sleep once what it serves is done (``mode=wait``; vLLM's
        default aborts the requests in flight)."""
        url = self._server(model)
        await self._post(url, f"/sleep?level={self._level}&mode=wait")
        self._slept[url] = self._level

    def _server(self, model: str) -> str:
        try:
            return self._servers[model]
        except KeyError:
            raise DriverError(f"no vLLM server for {model!r} on this instance") from None

    async def _sleeping(self, url: str) -> bool:
        try:
            response = await self._client.get(
                url + "/is_sleeping", headers=self._headers, timeout=POLL_TIMEOUT
            )
            return bool(response.raise_for_status().json()["is_sleeping"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise DriverError(
                f"GET {url}/is_sleeping: {exc} (is the server started with "
                "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1?)"
            ) from exc

    async def _post(self, url: str, path: str, body: dict[str, str] | None = None) -> None:
        try:
            response = await self._client.post(
                url + path, json=body, headers=self._headers, timeout=LOAD_TIMEOUT
            )
        except httpx.HTTPError as exc:
            raise DriverError(f"POST {url}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise DriverError(f"POST {url}{path} answered {response.status_code}")


def _where(url: str) -> str:
    """A server's host and port, as clients may read it (no path, no credentials)."""
    parts = httpx.URL(url)
    return f"{parts.host}:{parts.port}" if parts.port else parts.host
