"""The simulator's ``vllm`` flavour: one vLLM server of one model, with sleep mode (SPEC §15).

``POST /sleep?level=1`` keeps its weights in CPU RAM (a wake takes ``--wake-time``);
``level=2`` drops them (a wake takes ``--load-time``, a reload without a restart);
``GET /is_sleeping`` says which. It starts awake, like vLLM, unless ``--asleep 1|2``. As a
real vLLM server (docs/compatibility.md): a request to a sleeping model waits, silent, until a
wake (counted as ``held_asleep``); ``/health`` and ``/v1/models`` answer while asleep; ``/sleep``
and ``/wake_up`` answer JSON, and a sleep or a wake twice is no error. ``--fail-load-rate``
makes wakes fail too (500).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from swapgate.sim.backend import Backend

log = logging.getLogger("swapgate.sim")


class SleepMode:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        config = backend.config
        self.level = config.asleep  # 0: awake
        self._lock = asyncio.Lock()
        if not self.level:
            backend.resident = dict.fromkeys(config.models, "ready")
            backend.awake.set()

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health),
            Route("/is_sleeping", self.is_sleeping),
            Route("/sleep", self.sleep, methods=["POST"]),
            Route("/wake_up", self.wake_up, methods=["POST"]),
        ]

    async def health(self, _: Request) -> Response:
        return PlainTextResponse("")

    async def is_sleeping(self, _: Request) -> JSONResponse:
        return JSONResponse({"is_sleeping": bool(self.level)})

    async def sleep(self, request: Request) -> Response:
        level = request.query_params.get("level", "1")
        if level not in ("1", "2"):
            return JSONResponse({"error": f"level must be 1 or 2, not {level!r}"}, status_code=400)
        async with self._lock:
            if not self.level:
                self.level = int(level)
                self.backend.resident.clear()
                self.backend.awake.clear()
                self.backend.counters["sleeps"] += 1
                log.info("asleep (level %s)", level)
        return JSONResponse({"status": "sleeping", "level": self.level})

    async def wake_up(self, _: Request) -> Response:
        async with self._lock:
            if self.level:
                config = self.backend.config
                seconds = (
                    config.wake_time if self.level == 1 else config.load_time_of(config.models[0])
                )
                log.info("waking from level %d (%.1fs)", self.level, seconds)
                await asyncio.sleep(seconds)
                if self.backend.roll(config.fail_load_rate):
                    self.backend.counters["wake_failures"] += 1
                    return JSONResponse({"error": "simulated wake failure"}, status_code=500)
                self.level = 0
                self.backend.resident = dict.fromkeys(config.models, "ready")
                self.backend.awake.set()
                self.backend.counters["wakes"] += 1
        return JSONResponse({"status": "awake", "tags": None})
