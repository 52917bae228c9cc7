"""The simulated server's memory: which models are resident, one load at a time, and counters."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("swapgate.sim")
PROTOCOLS = ("openai", "anthropic")  # the APIs a simulator can speak, each its set of paths


@dataclass
class SimConfig:
    flavor: str = "llama-swap"
    host: str = "127.0.0.1"
    port: int = 9001
    models: tuple[str, ...] = ("a", "b", "c")
    capacity: int = 1
    load_time: float = 5.0
    load_times: Mapping[str, float] = field(default_factory=dict)  # per model, over load_time
    ttft: float = 0.05
    prefill: float = 0.0  # a stream's headers go out at once, its first token this much later
    token_rate: float = 50.0
    max_tokens: int = 16
    fail_load_rate: float = 0.0
    # Models whose engine exits at every start (a truncated GGUF, a context too large for the
    # card), answered as llama-swap answers such a start
    broken: tuple[str, ...] = ()
    crash_mid_stream_rate: float = 0.0
    hang_rate: float = 0.0
    # The next N requests answered 502 with no body, as a proxy in front of an engine answers
    # when its kept-alive connection to it was closed under it (Go's httputil.ReverseProxy)
    bad_gateway_next: int = 0
    bad_gateway_hold: float = 0.0  # seconds each of them is held first (an engine that died)
    # A request whose body holds this text is held ``crash_after`` s, then the simulator exits,
    # as an engine that the request crashes
    crash_on: str = ""
    crash_after: float = 3.0
    api_key: str | None = None
    seed: int | None = None
    grow_rss: int = 0  # bytes it keeps resident per request: a leak, to test recycling
    # Seconds its TTFT grows per GiB it holds: a KV pool that grows and fragments
    ttft_per_gib: float = 0.0
    protocols: tuple[str, ...] = ("openai",)
    asleep: int = 0  # flavour vllm: start asleep at this sleep level (0: awake)
    wake_time: float = 1.0  # flavour vllm: a wake from level 1
    # Seconds an idle connection stays open: uvicorn's 5 s, as llama-server's; a real llama-swap
    # closes none (Go's server without an idle timeout)
    keep_alive: float = 5.0

    def load_time_of(self, model: str) -> float:
        return self.load_times.get(model, self.load_time)

    def __post_init__(self) -> None:
        unknown = ", ".join(repr(p) for p in self.protocols if p not in PROTOCOLS)
        if unknown or not self.protocols:
            problem = f"unknown protocol {unknown}" if unknown else "no protocol"
            raise ValueError(f"{problem}; known: {', '.join(PROTOCOLS)}")


class LoadFailed(Exception):
    pass


class Backend:
    """Resident models in least-recently-used order; loads evict the oldest when full."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.dice = random.Random(config.seed)
        self.resident: dict[str, str] = {}  # model -> "starting" | "ready"
        self.counters: Counter[str] = Counter()
        self.loads: Counter[str] = Counter()
        self.last_body = b""
        self.leaked: list[bytes] = []
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self.awake = asyncio.Event()  # flavour vllm: set while awake (sim/vllm.py)
        self.stale_weights = False  # flavour vllm: woken from level 2, weights not reloaded
        if config.flavor == "openai":  # fixed-model servers load everything at start
            self.resident = dict.fromkeys(config.models, "ready")

    def roll(self, rate: float) -> bool:
        return rate > 0 and self.dice.random() < rate

    async def ensure_loaded(self, model: str) -> None:
        if self.config.flavor == "vllm":
            if not self.awake.is_set():  # as vLLM does: the request waits, silent, for a wake
                self.counters["held_asleep"] += 1
                await self.awake.wait()
            if self.stale_weights:  # woken from level 2 without reading its weights again
                self.counters["stale_answers"] += 1
            return
        if self.resident.get(model) == "ready":
            self.resident[model] = self.resident.pop(model)  # most recently used last
            return
        task = self._loading.get(model)
        if task is None:
            task = asyncio.create_task(self._load(model))
            self._loading[model] = task
            task.add_done_callback(lambda _: self._loading.pop(model, None))
        await asyncio.shield(task)

    async def _load(self, model: str) -> None:
        async with self._lock:
            if self.resident.get(model) == "ready":
                return
            while len(self.resident) >= self.config.capacity:
                self.unload(next(iter(self.resident)))
            self.resident[model] = "starting"
            self.loads[model] += 1
            seconds = self.config.load_time_of(model)
            log.info("loading %s (%.1fs)", model, seconds)
            await asyncio.sleep(seconds)
            if model in self.config.broken:
                del self.resident[model]
                self.counters["load_failures"] += 1
                raise LoadFailed(
                    f"unable to start process: upstream command exited prematurely\n"
                    f"llama_model_load: error loading model: tensor data of {model} is not"
                    " within the file bounds (exit status 1)"
                )
            if self.roll(self.config.fail_load_rate):
                del self.resident[model]
                self.counters["load_failures"] += 1
                # Each its own words, as a flaky start's are: no two read as the same error
                raise LoadFailed(f"simulated load failure of {model} (load {self.loads[model]})")
            self.resident[model] = "ready"

    def unload(self, model: str) -> bool:
        if self.resident.pop(model, None) is None:
            return False
        self.counters["unloads"] += 1
        log.info("unloaded %s", model)
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "loads": dict(self.loads),
            "resident": dict(self.resident),
            **{
                key: self.counters[key]
                for key in (
                    "requests",
                    "completed",
                    "cancelled",
                    "crashed",
                    "hung",
                    "active",
                    "load_failures",
                    "unloads",
                    "sleeps",
                    "wakes",
                    "held_asleep",
                    "wake_failures",
                    "weight_reloads",
                    "stale_answers",
                )
            },
        }
