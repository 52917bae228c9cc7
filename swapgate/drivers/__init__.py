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

# Every instance kind, by its driver: the one list (config/settings.py's InstanceKind types it,
# and a unit test holds the two and docs/configuration.md to each other).
DRIVERS: dict[str, type[Driver]] = {
    driver.kind: driver
    for driver in (
        LlamaSwapDriver,
        LlamaRouterDriver,
        OllamaDriver,
        OpenAIDriver,
        ProcessDriver,
        SwapOnRequestDriver,
        VllmSleepDriver,
    )
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
    driver = DRIVERS[instance.kind]
    if driver is ProcessDriver:  # the kinds that need more than a URL and a key
        return ProcessDriver(instance, client, events, ledger)
    if driver is VllmSleepDriver:
        return VllmSleepDriver(
            instance.servers, instance.sleep_level, client, secret(instance.api_key_env)
        )
    return driver(instance.url, client, secret(instance.api_key_env), instance.models is None)
