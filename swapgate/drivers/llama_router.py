"""llama.cpp's ``llama-server`` in router mode (``--models-preset FILE --models-max N``): several
models behind one port, each a child process the router starts and stops on request.

swapgate makes every choice the router would otherwise make by itself: it picks each victim by
its own eviction rules and unloads it (waiting until the child has exited) before it loads, so
the router's LRU never chooses and its ``500 model limit reached`` never reaches a client.
Proxied requests carry ``?autoload=false`` so that a request can never load a model swapgate did
not ask for (docs/configuration.md, ``kind: llama-router``).

The router's own API, as of llama.cpp b11434 (tools/server/server-models.cpp):
``GET /models`` lists every model with ``status.value`` (``loaded``, ``loading``, ``sleeping``,
``unloaded``; a failed load is ``unloaded`` with ``failed: true`` and ``exit_code``);
``POST /models/load`` and ``/models/unload`` answer at once (``400`` when the model already
runs / does not run); ``GET /models/sse`` streams each status change; ``GET /props`` says
``max_instances`` (``--models-max``) and ``models_autoload``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from swapgate.data.warm import InstanceReport, Stage, WarmState
from swapgate.drivers.base import LOAD_TIMEOUT, Driver
from swapgate.drivers.children import exit_name
from swapgate.errors import DriverError

log = logging.getLogger("swapgate.drivers.llama_router")

_STATES = {"loaded": WarmState.WARM, "loading": WarmState.LOADING, "sleeping": WarmState.ASLEEP}
STATUS_PAUSE = 0.1  # between looks at a model's status while it loads or stops
# A stopping child gets the preset's stop-timeout (10 s by default) before the router kills it.
STOP_WAIT = 30.0
# Query parameters every proxied request carries: never load on a request's behalf.
PROXY_QUERY = "autoload=false"


class LimitReached(DriverError):
    """The router already runs ``--models-max`` models."""


class LlamaRouterDriver(Driver):
    kind = "llama-router"

    proxy_query = PROXY_QUERY
    # --models-max, read from GET /props once (and again after the router was unreachable)
    _max_models: int | None = None
    _max_read = False

    def __init__(
        self, url: str, client: httpx.AsyncClient, api_key: str | None = None, discover: bool = True
    ) -> None:
        super().__init__(url, client, api_key, discover)
        self._stages: dict[str, Stage] = {}  # each loading model's stage, as last announced

    async def state(self) -> InstanceReport:
        entries = await self._models()
        running = {}
        for model, status in entries.items():
            state = _STATES.get(str(status.get("value")))
            if state is not None:
                running[model] = state
        available = frozenset(entries) if self._discover else None
        if not self._max_read:
            self._max_models, self._max_read = await self._limit(), True
        return InstanceReport(running=running, available=available, capacity=self._max_models)

    async def load(self, model: str) -> None:
        """Ask the router to start ``model``'s child and wait until it serves."""
        try:
            await self._post("/models/load", model, ok_when="already running")
        except LimitReached:
            # A child the router put to sleep (--sleep-idle-seconds) keeps its place in
            # --models-max although swapgate counts it asleep, taking none: stop those.
            for sleeper in await self._sleeping():
                await self.unload(sleeper)
            await self._post("/models/load", model, ok_when="already running")
        while True:
            status = (await self._models()).get(model)
            if status is None:
                raise DriverError(f"the router no longer lists {model!r}")
            value = status.get("value")
            if value == "loaded":
                return
            if value == "unloaded":
                code = status.get("exit_code")
                how = exit_name(code) if isinstance(code, int) else f"exit code {code}"
                raise DriverError(f"the router's {model!r} exited with {how} while loading")
            await asyncio.sleep(STATUS_PAUSE)

    async def unload(self, model: str) -> None:
        """Stop ``model``'s child and wait until it exited: only then is its place free."""
        await self._post("/models/unload", model, ok_when="not running")
        try:
            async with asyncio.timeout(STOP_WAIT):
                while await self._running(model):  # noqa: ASYNC110 (another process's state)
                    await asyncio.sleep(STATUS_PAUSE)
        except TimeoutError:
            raise DriverError(
                f"the router's {model!r} still runs {STOP_WAIT:g}s after unload"
            ) from None

    def changes(self) -> AsyncIterator[None]:
        """Yields at every status change the router announces on ``GET /models/sse``, so a
        model loaded or unloaded there by hand shows at once; reconnects when it breaks. Its
        load stages are kept for ``load_stage`` on the way."""
        return self._follow("/models/sse", self._heard)

    def load_stage(self, model: str) -> Stage | None:
        return self._stages.get(model)

    def _heard(self, event: dict[str, Any]) -> bool:
        """Keep a load's stage (``{"status": "loading", "progress": {"stages", "current",
        "value"}}``); every event is a change."""
        model, data = str(event.get("model")), event.get("data") or {}
        progress = data.get("progress") if isinstance(data, dict) else None
        if data.get("status") != "loading":
            self._stages.pop(model, None)
        elif isinstance(progress, dict):
            stage = _stage(progress)
            if stage is not None:
                self._stages[model] = stage
        return True

    async def _models(self) -> dict[str, dict[str, Any]]:
        try:
            body = await self._json("/models")
        except DriverError:
            self._max_read = False  # a router that comes back may run with other flags
            raise
        try:
            return {str(m["id"]): dict(m.get("status") or {}) for m in body["data"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise DriverError("GET /models: expected {'data': [{'id', 'status'}]}") from exc

    async def _running(self, model: str) -> bool:
        return str((await self._models()).get(model, {}).get("value")) in _STATES

    async def _sleeping(self) -> list[str]:
        return [m for m, s in (await self._models()).items() if s.get("value") == "sleeping"]

    async def _limit(self) -> int | None:
        """``--models-max``: how many models the router runs at once (0: no limit)."""
        try:
            limit = int((await self._json("/props"))["max_instances"])
        except (KeyError, TypeError, ValueError):
            return None
        return limit if limit > 0 else None

    async def _post(self, path: str, model: str, ok_when: str) -> None:
        response = await self._request("POST", path, json={"model": model}, timeout=LOAD_TIMEOUT)
        if response.status_code == 200 or ok_when in response.text:
            return
        if "model limit reached" in response.text:
            raise LimitReached(f"POST {path} {model!r}: the router runs --models-max models")
        raise DriverError(f"POST {path} {model!r} answered {response.status_code}: {response.text}")


def _stage(progress: dict[str, Any]) -> Stage | None:
    """The router's ``{"stages": [...], "current": name, "value": 0..1}``, as a ``Stage``."""
    stages, current = progress.get("stages"), progress.get("current")
    if not isinstance(stages, list) or current not in stages:
        return None  # a stage named alone ({"stage": "mmproj_model"}): nothing to count
    try:
        value = float(progress.get("value", 0.0))
    except (TypeError, ValueError):
        return None
    return Stage(stages.index(current) + 1, len(stages), str(current), min(1.0, max(0.0, value)))
