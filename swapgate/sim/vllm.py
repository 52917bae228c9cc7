"""The simulator's ``vllm`` flavour: one vLLM server of one model, with sleep mode
(docs/configuration.md).

``POST /sleep?level=1`` keeps its weights in CPU RAM (a wake takes ``--wake-time``);
``level=2`` drops them: a wake gives back their memory, whose values are undefined until
``POST /collective_rpc {"method": "reload_weights"}`` (``--load-time``); an answer from such
weights counts as ``stale_answers``;
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


TAGS = frozenset({"weights", "kv_cache"})


class SleepMode:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        config = backend.config
        self.level = config.asleep  # 0: awake
        self.sleeping: set[str] = set(TAGS) if self.level else set()  # what a wake must bring
        self._lock = asyncio.Lock()
        if not self.level:
            self._awake()

    def routes(self) -> list[Route]:
        return [
            Route("/health", self.health),
            Route("/is_sleeping", self.is_sleeping),
            Route("/sleep", self.sleep, methods=["POST"]),
            Route("/wake_up", self.wake_up, methods=["POST"]),
            Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
        ]

    async def health(self, _: Request) -> Response:
        return PlainTextResponse("")

    async def is_sleeping(self, _: Request) -> JSONResponse:
        return JSONResponse({"is_sleeping": bool(self.sleeping)})

    async def sleep(self, request: Request) -> Response:
        level = request.query_params.get("level", "1")
        if level not in ("1", "2"):
            return JSONResponse({"error": f"level must be 1 or 2, not {level!r}"}, status_code=400)
        async with self._lock:
            if not self.sleeping:
                self.level = int(level)
                self.sleeping = set(TAGS)
                self.backend.resident.clear()
                self.backend.awake.clear()
                self.backend.counters["sleeps"] += 1
                log.info("asleep (level %s)", level)
        return JSONResponse({"status": "sleeping", "level": self.level})

    async def wake_up(self, request: Request) -> Response:
        """All that sleeps, or the ``tags`` given; from level 2, the weights come back as
        memory whose values are undefined until ``reload_weights``."""
        tags = set(request.query_params.getlist("tags")) or set(self.sleeping)
        async with self._lock:
            if tags & self.sleeping:
                config = self.backend.config
                log.info("waking %s from level %d", sorted(tags), self.level)
                await asyncio.sleep(config.wake_time)
                if self.backend.roll(config.fail_load_rate):
                    self.backend.counters["wake_failures"] += 1
                    return JSONResponse({"error": "simulated wake failure"}, status_code=500)
                if "weights" in tags & self.sleeping and self.level == 2:
                    self.backend.stale_weights = True
                self.sleeping -= tags
                if not self.sleeping:
                    self.level = 0
                    self._awake()
                    self.backend.counters["wakes"] += 1
        status = "sleeping" if self.sleeping else "awake"
        return JSONResponse({"status": status, "tags": request.query_params.getlist("tags")})

    async def collective_rpc(self, request: Request) -> Response:
        """Only ``reload_weights``: the weights read again from disk (``--load-time``)."""
        method = (await request.json()).get("method")
        if method != "reload_weights":
            return JSONResponse({"error": f"no method {method!r} here"}, status_code=400)
        await asyncio.sleep(self.backend.config.load_time_of(self.backend.config.models[0]))
        self.backend.stale_weights = False
        self.backend.counters["weight_reloads"] += 1
        return Response(status_code=200)

    def _awake(self) -> None:
        self.backend.resident = dict.fromkeys(self.backend.config.models, "ready")
        self.backend.awake.set()
