"""Drivers speak each backend's own API; ``make_driver`` picks one by ``kind``."""

from __future__ import annotations

import httpx

from swapgate.config.settings import InstanceConfig, secret
from swapgate.drivers.base import Driver
from swapgate.drivers.ledger import Ledger
from swapgate.drivers.llama_router import LlamaRouterDriver
from swapgate.drivers.llama_swap import LlamaSwapDriver
from swapgate.drivers.ollama import OllamaDriver
from swapgate.drivers.openai import OpenAIDriver
from swapgate.drivers.process import ProcessDriver, ProcessEvents
from swapgate.drivers.swap_on_request import SwapOnRequestDriver
from swapgate.drivers.vllm_sleep import VllmSleepDriver

DRIVERS: dict[str, type[Driver]] = {
    "llama-swap": LlamaSwapDriver,
    "llama-router": LlamaRouterDriver,
    "ollama": OllamaDriver,
    "openai": OpenAIDriver,
    "swap-on-request": SwapOnRequestDriver,
}

__all__ = ["DRIVERS", "Driver", "ProcessDriver", "ProcessEvents", "make_driver"]


def make_driver(
    instance: InstanceConfig,
    client: httpx.AsyncClient,
    events: ProcessEvents | None = None,
    ledger: Ledger | None = None,
) -> Driver:
    """``events`` and ``ledger``: where a process instance tells what its processes do, and
    records what it started."""
    if instance.kind == "process":
        return ProcessDriver(instance, client, events, ledger)
    if instance.kind == "vllm-sleep":
        return VllmSleepDriver(
            instance.servers, instance.sleep_level, client, secret(instance.api_key_env)
        )
    discover = instance.models is None
    return DRIVERS[instance.kind](instance.url, client, secret(instance.api_key_env), discover)
