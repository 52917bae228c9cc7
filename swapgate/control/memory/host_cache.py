"""The ``cached`` tier (docs/host-cache.md): the weights of the models likeliest to load next,
kept in the host's page cache ahead of their swap, so that the swap reads RAM, not disk.

Every ``host_cache.interval`` it measures what of each
model's weight files is resident (``mincore``), chooses what to keep (swapgate/policy/keep.py:
queued models first, then the next preloads, then by demand, within ``budget``), lets go of
files it brought in that are no longer chosen (never a loaded model's, never a file it did not
bring in), and reads in what is chosen and not resident, sequentially, at most ``read_rate``,
pausing whenever a swap runs (a load reads the same disk). Without a budget it only measures:
``/admin/state`` and the swaps' ``weights`` tier still say what is resident.

It measures only what a decision needs: the files of models not loaded (a loaded model's are
its engine's, and no swap reads them), always on a thread of its own, never on the event loop;
and less often as the files grow: each measurement takes at most ``MEASURE_SHARE`` of a core
(``mincore`` over 20 GB takes about 0.2 s: one every 10 s; over 200 GB, one every 100 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

from swapgate.config.settings import HostCacheConfig
from swapgate.config.sizes import WeightFiles, weight_files
from swapgate.control.memory import pages
from swapgate.control.state.registry import Registry
from swapgate.data.snapshot import AWAKE, Snapshot
from swapgate.metrics import Metrics
from swapgate.policy.keep import keep, wanted

log = logging.getLogger("swapgate.host_cache")
Tier = Literal["cached", "cold", "unknown"]
CACHED = 0.9  # of its weights resident: a swap of it reads RAM
OURS = 0.05  # a file less resident than this when it was read in was brought in by swapgate
SOON = 3600.0  # preloads due within this many seconds count
DEMAND_HORIZON = 600.0  # a model's chance of a request within this many seconds ranks the rest
MEASURE_SHARE = 0.02  # of a core that measuring may take: slower measures come less often


def _nothing_upcoming() -> list[tuple[float, str]]:
    return []


class HostCache:
    def __init__(
        self,
        config: HostCacheConfig,
        weights: dict[str, WeightFiles],
        registry: Registry,
        metrics: Metrics,
        upcoming: Callable[[], list[tuple[float, str]]] = _nothing_upcoming,
    ) -> None:
        """``weights``: each model's weight files or folders (``Catalog.weights``);
        ``upcoming``: the next preloads as (wall-clock time, model)."""
        self._config = config
        self._paths = dict(weights)
        self._registry = registry
        self._metrics = metrics
        self.upcoming = upcoming
        self._files: dict[str, list[Path]] = {}
        self._size: dict[Path, int] = {}
        self._resident: dict[Path, int] = {}
        self.ours: set[Path] = set()  # files it brought in and holds
        self.kept: list[str] = []  # the models it chose last, most wanted first
        self.measured_in = 0.0  # seconds the last measurement took (its thread's CPU)

    def reconfigure(self, config: HostCacheConfig, weights: dict[str, WeightFiles]) -> None:
        self._config, self._paths = config, dict(weights)

    # -- what clients of it read ---------------------------------------------------------------

    def tier(self, model: str) -> Tier:
        """Where a swap of ``model`` would read its weights from now."""
        files = self._files.get(model)
        if not files:
            return "unknown"
        size = sum(self._size.get(f, 0) for f in files)
        resident = sum(self._resident.get(f, 0) for f in files)
        return "cached" if size and resident >= CACHED * size else "cold"

    def describe(self, model: str) -> dict[str, int] | None:
        """``{"bytes", "resident_bytes"}`` of ``model``'s weights, if they are known."""
        files = self._files.get(model)
        if not files:
            return None
        return {
            "bytes": sum(self._size.get(f, 0) for f in files),
            "resident_bytes": sum(self._resident.get(f, 0) for f in files),
        }

    @property
    def held(self) -> int:
        """Bytes of the files it brought in that are resident now."""
        return sum(self._resident.get(f, 0) for f in self.ours)

    # -- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except OSError as exc:  # a file gone or unreadable: said, and looked at again
                log.warning("host cache: %s", exc)
            await asyncio.sleep(max(self._config.interval, self.measured_in / MEASURE_SHARE))

    async def step(self) -> None:
        """Measure, choose, let go, read in: once. Nothing to do where no model names its
        weights (the usual config): no snapshot of the fleet every interval either."""
        if not (self._paths or self._files or self.ours):
            return
        loaded = _loaded(self._registry.snapshot())
        await asyncio.to_thread(self._measure, loaded)
        budget = self._config.budget
        if budget is not None:
            chosen = self.choose(budget)
            await self._let_go(chosen)
            await self._read_in(chosen)
        self._export()

    def choose(self, budget: int) -> list[str]:
        """The models whose weights to keep now, most wanted first (policy/keep.py)."""
        snap = self._registry.snapshot()
        loaded = _loaded(snap)
        now = time.time()
        upcoming = [(at, m) for at, m in self.upcoming() if now <= at <= now + SOON]
        chances = {
            model: arrivals.chance_within(snap.now, DEMAND_HORIZON)
            for model, arrivals in snap.arrivals.items()
        }
        order = wanted(self._registry.queues.oldest(), upcoming, chances, loaded)
        sizes = {m: sum(self._size.get(f, 0) for f in self._files.get(m, ())) for m in order}
        self.kept = keep([m for m in order if sizes.get(m)], sizes, budget)
        return self.kept

    def _measure(self, loaded: set[str]) -> None:
        """Sizes of every weight file, and what is resident of those a model not ``loaded``
        reads (on its own thread: ``mincore`` takes a while over large files)."""
        started = time.thread_time()
        files = {model: weight_files(paths) for model, paths in self._paths.items()}
        wanted = {f for model, found in files.items() if model not in loaded for f in found}
        size, resident = {}, {}
        for path in {f for found in files.values() for f in found}:
            try:
                size[path] = path.stat().st_size
            except OSError:
                continue
            if path in wanted or path not in self._resident:
                resident[path] = pages.resident(path) or 0
            else:  # a loaded model's: its engine holds it, no decision reads it
                resident[path] = self._resident[path]
        self._files, self._size, self._resident = files, size, resident
        self.measured_in = time.thread_time() - started

    async def _let_go(self, chosen: Iterable[str]) -> None:
        """Drop the files it brought in that no chosen or loaded model needs."""
        loaded = _loaded(self._registry.snapshot())
        needed = {f for m in [*chosen, *loaded] for f in self._files.get(m, ())}
        for path in sorted(self.ours - needed):
            self._resident[path] = await asyncio.to_thread(_let_go, path)
            self.ours.discard(path)
            log.info("host cache: let go of %s", path.name)

    async def _read_in(self, chosen: Iterable[str]) -> None:
        for model in chosen:
            for path in self._files.get(model, ()):
                size = self._size.get(path, 0)
                before = self._resident.get(path, 0)
                if before >= CACHED * size:
                    continue
                if not self._quiet():
                    return  # a load reads the disk now: the next step goes on
                started = time.monotonic()

                def progress(done: int, path: Path = path, before: int = before) -> None:
                    # A swap that starts while the file is read sees how far it got (its tier).
                    self._resident[path] = max(before, done)

                read, now = await asyncio.to_thread(
                    _bring_in, path, self._config.read_rate, self._quiet, progress
                )
                if before < OURS * size:
                    self.ours.add(path)
                self._resident[path] = now
                log.info(
                    "host cache: read %s for %s (%.0f MiB in %.1fs)",
                    path.name,
                    model,
                    read / 2**20,
                    time.monotonic() - started,
                )

    def _quiet(self) -> bool:
        """No swap runs anywhere now (also asked from the reading thread between chunks)."""
        return not self._registry.swapping_anywhere()

    def _export(self) -> None:
        for model in self._files:
            described = self.describe(model)
            if described is not None:
                self._metrics.weights_resident.labels(model).set(described["resident_bytes"])
        self._metrics.host_cache_bytes.set(self.held)


def _let_go(path: Path) -> int:
    """Drop ``path`` from the page cache; what is still resident of it."""
    pages.let_go(path)
    return pages.resident(path) or 0


def _bring_in(
    path: Path, rate: float, go_on: Callable[[], bool], progress: Callable[[int], None]
) -> tuple[int, int]:
    """Read ``path`` into the page cache: the bytes read, and what is resident of it after."""
    read = pages.bring_in(path, rate, go_on, progress)
    return read, pages.resident(path) or 0


def _loaded(snap: Snapshot) -> set[str]:
    """The models warm or loading anywhere: their weights are their engines'."""
    return {m for i in snap.instances for m, v in i.models.items() if v.state in AWAKE}
