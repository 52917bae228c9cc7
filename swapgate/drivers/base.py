"""The driver interface: how swapgate learns and changes what an instance has warm."""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, ClassVar

import httpx

from swapgate.config.settings import InstanceKind
from swapgate.data.warm import InstanceReport, Stage, WarmState
from swapgate.errors import DriverError, DriverTimeout, DriverUnreachable

# A poll that takes longer than this says the instance is not healthy.
POLL_TIMEOUT = httpx.Timeout(5.0)
# Loads are bounded by routing.swap_timeout in the swap coordinator, not here.
LOAD_TIMEOUT = httpx.Timeout(None, connect=5.0)
RECONNECT_PAUSE = 1.0  # after an instance's event stream broke, before it is followed again
log = logging.getLogger("swapgate.drivers")


def _every(event: dict[str, Any]) -> bool:
    return True


class Driver(ABC):
    """One backend instance, spoken to in its own API (docs/configuration.md)."""

    kind: ClassVar[InstanceKind]  # the kind it speaks for: swapgate/drivers/__init__.py
    evicts_to = WarmState.COLD  # what an unloaded model becomes: vLLM's sleep keeps it asleep
    # Whether cancelling ``load`` stops the load (a process it started is stopped); elsewhere
    # the backend goes on loading whatever swapgate does, so an abandoned load is finished.
    cancels_loads = False
    # Query parameters added to every request proxied to the instance (a router's autoload=false)
    proxy_query = ""
    # Whether swapgate puts what is awake beyond the instance's capacity back to sleep: the
    # engine keeps every copy awake until told (vLLM); others evict by themselves, or only run
    # what swapgate started.
    trims_to_capacity = False
    # Whether a poll may reach the instance while its answers stream. Not llama-cpp-python's:
    # its model list waits for the running answer, and (interrupt_requests, its default) cuts
    # that answer short for it.
    polls_while_busy = True

    def __init__(
        self,
        url: str,
        client: httpx.AsyncClient,
        api_key: str | None = None,
        discover: bool = True,
    ) -> None:
        self.url = url
        self._client = client
        # False when the config lists the instance's models: polls then skip the model list.
        self._discover = discover
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}

    @abstractmethod
    async def state(self) -> InstanceReport:
        """Poll the instance; raise ``DriverError`` when it does not answer sanely."""

    @abstractmethod
    async def load(self, model: str) -> None:
        """Make ``model`` (an upstream name) warm; return when it is ready to serve."""

    @abstractmethod
    async def unload(self, model: str) -> None:
        """Evict ``model``; a no-op for backends that evict by themselves."""

    async def check_loadable(self, model: str) -> None:  # noqa: B027 (a hook: vLLM's servers)
        """Raise ``DriverError`` when ``model`` surely cannot load now (its own server does not
        answer): asked before anything is evicted for it, so nothing healthy goes for it."""

    @property
    def headers(self) -> dict[str, str]:
        """What its control calls send: the instance's key, if it has one."""
        return dict(self._headers)

    def model_url(self, model: str) -> str | None:
        """Where requests for ``model`` go, when not to the instance's ``url`` (``process``
        instances run a server per model, each on a port of its own)."""
        return None

    def load_stage(self, model: str) -> Stage | None:
        """How far the engine says its load of ``model`` has got, where it says (llama.cpp's
        router on ``/models/sse``); None for the others."""
        return None

    async def changes(self) -> AsyncIterator[None]:
        """Yields whenever the instance announces a change of its warm state, which the poller
        then reads at once; most backends announce nothing and are only polled."""
        return
        yield

    async def _follow(
        self, path: str, wanted: Callable[[dict[str, Any]], bool] = _every
    ) -> AsyncIterator[None]:
        """Yields at every event of the instance's Server-Sent Events stream ``path`` that is
        ``wanted``, following it again whenever it breaks; an instance without that stream
        (404: an older release) ends it, and polls alone tell its changes."""
        while True:
            try:
                async for event in self._sse(path):
                    if wanted(event):
                        yield None
            except _NoStream:
                log.info("%s has no %s: its changes show at the next poll", self.url, path)
                return
            except (httpx.HTTPError, DriverError) as exc:
                log.debug("%s%s: %s; following it again", self.url, path, exc)
            await asyncio.sleep(RECONNECT_PAUSE)

    async def _sse(self, path: str) -> AsyncIterator[dict[str, Any]]:
        timeout = httpx.Timeout(None, connect=5.0)
        url = self.url + path
        async with self._client.stream("GET", url, headers=self._headers, timeout=timeout) as r:
            if r.status_code == 404:
                raise _NoStream(path)
            if r.status_code != 200:
                raise DriverError(f"GET {path} answered {r.status_code}")
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    try:
                        yield dict(json.loads(line[5:]))
                    except (ValueError, TypeError):
                        continue

    async def aclose(self) -> None:  # noqa: B027 (a hook: only process drivers run anything)
        """Stop what the driver runs itself; nothing for servers someone else runs."""

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        timeout: httpx.Timeout = POLL_TIMEOUT,
    ) -> httpx.Response:
        try:
            response = await self._client.request(
                method, self.url + path, json=json, headers=self._headers, timeout=timeout
            )
        except httpx.TimeoutException as exc:
            raise DriverTimeout(
                f"{method} {path}: no answer in time ({type(exc).__name__})"
            ) from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            raise DriverUnreachable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise DriverError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        return response

    async def _json(self, path: str) -> Any:
        response = await self._request("GET", path)
        if response.status_code != 200:
            raise DriverError(f"GET {path} answered {response.status_code}")
        try:
            return response.json()
        except ValueError as exc:
            raise DriverError(f"GET {path} did not answer JSON") from exc

    async def _openai_models(self) -> frozenset[str]:
        """The ids of ``GET /v1/models``, which every flavour here speaks."""
        body = await self._json("/v1/models")
        try:
            return frozenset(str(entry["id"]) for entry in body["data"])
        except (KeyError, TypeError) as exc:
            raise DriverError("GET /v1/models: no data[].id list") from exc


class _NoStream(DriverError):
    """The instance has no such event stream."""
