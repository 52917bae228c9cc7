"""llama-swap: ``/running`` for warm state, ``/upstream/MODEL/health`` to load."""

from __future__ import annotations

import asyncio

from swapgate.drivers.base import LOAD_TIMEOUT, Driver
from swapgate.errors import DriverError
from swapgate.model.state import InstanceReport, WarmState

# llama-swap's process states; "stopping" frees its memory, so it is cold for placement.
_STATES = {"ready": WarmState.WARM, "starting": WarmState.LOADING}
LOAD_ATTEMPTS = 3
RETRY_PAUSE = 1.0


class LlamaSwapDriver(Driver):
    async def state(self) -> InstanceReport:
        body = await self._json("/running")
        try:
            running = {
                str(entry["model"]): _STATES.get(str(entry.get("state")), WarmState.COLD)
                for entry in body["running"]
            }
        except (KeyError, TypeError) as exc:
            raise DriverError("GET /running: expected {'running': [{'model', 'state'}]}") from exc
        available = await self._openai_models() if self._discover else None
        return InstanceReport(running=running, available=available)

    async def load(self, model: str) -> None:
        # The health request blocks while llama-swap starts the model; a 5xx is a failed start.
        path = f"/upstream/{model}/health"
        for attempt in range(LOAD_ATTEMPTS):
            response = await self._request("GET", path, timeout=LOAD_TIMEOUT)
            if response.status_code < 500:
                return
            if attempt + 1 < LOAD_ATTEMPTS:
                await asyncio.sleep(RETRY_PAUSE)
        raise DriverError(f"GET {path} answered {response.status_code} {LOAD_ATTEMPTS} times")

    async def unload(self, model: str) -> None:
        response = await self._request("POST", f"/api/models/unload/{model}")
        if response.status_code == 404 and "not found" not in response.text:
            # Releases before the /api group only know the unload-everything endpoint.
            response = await self._request("GET", "/unload")
        if response.status_code >= 400:
            raise DriverError(f"unload {model} answered {response.status_code}")
