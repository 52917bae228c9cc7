"""Servers that swap by themselves and report nothing (llama-cpp-python, LocalAI)."""

from __future__ import annotations

from swapgate.data.warm import InstanceReport
from swapgate.drivers.base import LOAD_TIMEOUT, Driver
from swapgate.errors import DriverError


class SwapOnRequestDriver(Driver):
    kind = "swap-on-request"

    polls_while_busy = False  # llama-cpp-python's /v1/models would cut a running stream

    async def state(self) -> InstanceReport:
        # Warm state is whatever swapgate last sent there; the poll only proves health.
        return InstanceReport(running=None, available=await self._openai_models())

    async def load(self, model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "ok"}], "max_tokens": 1}
        response = await self._request(
            "POST", "/v1/chat/completions", json=body, timeout=LOAD_TIMEOUT
        )
        if response.status_code != 200:
            raise DriverError(f"1-token warm-up request answered {response.status_code}")

    async def unload(self, model: str) -> None:
        """Nothing to do: the server evicts by itself when asked for another model."""
