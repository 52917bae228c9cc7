"""Servers with fixed models (vLLM, SGLang, TGI, llama-server): warm while they answer."""

from __future__ import annotations

from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import Driver
from swapgate.errors import DriverError


class OpenAIDriver(Driver):
    kind = "openai"

    async def state(self) -> InstanceReport:
        try:
            models = await self._openai_models()
        except DriverError:
            # Some servers gate /v1/models; /health alone still says the configured models are up.
            response = await self._request("GET", "/health")
            if response.status_code != 200:
                raise
            return InstanceReport(running=None, available=None, all_warm=True)
        return InstanceReport(running=dict.fromkeys(models, WarmState.WARM), available=models)

    async def load(self, model: str) -> None:
        """Nothing to do: the server holds its models for its whole life."""

    async def unload(self, model: str) -> None:
        """Nothing to do: the server cannot drop a model."""
