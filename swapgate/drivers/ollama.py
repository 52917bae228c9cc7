"""Ollama: ``/api/ps`` for warm state, ``/api/generate`` without a prompt to load and unload."""

from __future__ import annotations

from typing import Any

from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import LOAD_TIMEOUT, Driver
from swapgate.errors import DriverError

# Ollama resets a model's keep-alive on every request; -1 only keeps it until the first one.
LOAD_KEEP_ALIVE = -1


class OllamaDriver(Driver):
    kind = "ollama"

    async def state(self) -> InstanceReport:
        ps = await self._json("/api/ps")
        running = _names(ps, "/api/ps")
        available = None
        if self._discover:
            available = frozenset(_names(await self._json("/api/tags"), "/api/tags"))
        return InstanceReport(
            running=dict.fromkeys(running, WarmState.WARM), available=available, sizes=_vram(ps)
        )

    async def load(self, model: str) -> None:
        await self._generate(model, LOAD_KEEP_ALIVE)

    async def unload(self, model: str) -> None:
        await self._generate(model, 0)

    async def _generate(self, model: str, keep_alive: int) -> None:
        body = {"model": model, "keep_alive": keep_alive}
        response = await self._request("POST", "/api/generate", json=body, timeout=LOAD_TIMEOUT)
        if response.status_code != 200:
            raise DriverError(f"POST /api/generate {body} answered {response.status_code}")


def _names(body: Any, path: str) -> list[str]:
    try:
        return [str(entry.get("model") or entry["name"]) for entry in body["models"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise DriverError(f"GET {path}: expected {{'models': [{{'name', 'model'}}]}}") from exc


def _vram(body: Any) -> dict[str, int]:
    """What each loaded model really takes on the GPU (``size_vram``), where Ollama says."""
    sizes: dict[str, int] = {}
    for entry in body.get("models", []) if isinstance(body, dict) else []:
        name, vram = entry.get("model") or entry.get("name"), entry.get("size_vram")
        if isinstance(name, str) and isinstance(vram, int) and vram > 0:
            sizes[name] = vram
    return sizes
