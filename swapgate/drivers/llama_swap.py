"""llama-swap (docs/compatibility.md, note 9): ``/running`` for warm state, followed live on its
``/api/events``; ``/upstream/MODEL/health`` to load, ``/api/models/unload/MODEL`` to unload.

What the real one does (v250, read in its source and run in tests/engine/test_llama_swap.py):
``GET /running`` lists every process not stopped, ``ready``, ``starting`` or ``stopping``;
``GET /api/events`` streams ``{"type": "modelStatus", "data": "<JSON list>"}`` at every process
state change (its own loads, its ``ttl``, loads by hand) among much else (log lines), with a
snapshot first; ``/upstream/MODEL/PATH`` loads the model (as its groups say) and forwards PATH to
it; an unload answers once the process stopped. Its ``apiKeys`` guard every endpoint but
``/health``: the instance's ``api_key_env`` goes with control calls as with requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import LOAD_TIMEOUT, Driver
from swapgate.errors import DriverError
from swapgate.policy.timing import retry_after

# llama-swap's process states; "stopping" frees its memory, so it is cold for placement.
_STATES = {"ready": WarmState.WARM, "starting": WarmState.LOADING}
LOAD_ATTEMPTS = 3
RETRY_PAUSE = 1.0


def _model_status(event: dict[str, Any]) -> bool:
    """A change of some model's process state (not a log line, an activity or a request)."""
    return event.get("type") == "modelStatus"


class LlamaSwapDriver(Driver):
    kind = "llama-swap"

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

    def changes(self) -> AsyncIterator[None]:
        """Yields at every model state change llama-swap announces (its ``ttl``, a load or an
        unload by hand), so each shows at once; releases before ``/api/events`` are polled."""
        return self._follow("/api/events", _model_status)

    async def load(self, model: str) -> None:
        """The health request blocks while llama-swap starts the model: a 5xx is a failed
        start, told at once when it carries the engine's words (its process exited: every try
        starts it again, docs/operations.md "When part of the fleet breaks"), else tried again
        twice; a 429 its ``concurrencyLimit`` (the health request counts
        as one of the model's requests: asked again after ``Retry-After``; ``swap_timeout``
        bounds it all)."""
        path = f"/upstream/{model}/health"
        failures = 0
        while True:
            response = await self._request("GET", path, timeout=LOAD_TIMEOUT)
            status = response.status_code
            if status < 400:
                return  # it runs: the engine's own health answered
            if status == 429:
                await asyncio.sleep(retry_after(response.headers.get("retry-after")))
                continue
            failures += 1
            said = response.text.strip()
            if status < 500 or said or failures >= LOAD_ATTEMPTS:  # 401, 404: no retry helps
                raise DriverError(f"GET {path} answered {status}: {said[-600:]}")
            await asyncio.sleep(RETRY_PAUSE)

    async def unload(self, model: str) -> None:
        response = await self._request("POST", f"/api/models/unload/{model}")
        if response.status_code == 404 and "not found" not in response.text:
            # Releases before the /api group only know the unload-everything endpoint.
            response = await self._request("GET", "/unload")
        if response.status_code >= 400:
            raise DriverError(f"unload {model} answered {response.status_code}")
