"""How far a running load has got, as a real figure (docs/operations.md, "Load progress"): what
the person waiting is told (``progress: reasoning``), the dashboard shows and
``swapgate_load_progress_ratio`` exports.

The figure is the best the engine offers, in this order:

1. **bytes of the weights read**, where swapgate knows the model's weight files (a ``process``
   command's ``-m``, a model's ``weights`` or ``gguf``) and they were not already in the page
   cache when the load began: their resident bytes (``mincore``) over their size, "7.4 of
   14.2 GB read";
2. the **engine's own load stages**, where it announces them (llama.cpp's router on
   ``/models/sse``: its stages and the share of each one's tensors loaded), "stage 1 of 2,
   42%";
3. otherwise the **elapsed share of the measured load** (or wake) for that tier: "about 6 s
   left", or, past it, "2 s longer than its usual 8 s";
4. before the gateway measured any load and without ``expected_swap``: no figure to share, so
   none is made up, "loading, 3 s so far".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from swapgate.config.sizes import WeightFiles
from swapgate.data.warm import Stage
from swapgate.policy.timing import EXPECTED_SWAP

ALREADY_READ = 0.9  # of the weights resident as a load begins: bytes say nothing, time does
SHOWN = 0.99  # a figure never says "done" while the load still runs
FRESH = 0.5  # seconds a figure is told again before it is measured anew


def _no_stage(instance: str, model: str) -> Stage | None:
    return None


@dataclass(frozen=True, slots=True)
class Figure:
    ratio: float  # 0 to SHOWN
    text: str  # what the person is told of it


@dataclass(slots=True)
class _Load:
    began: float
    expected: float | None  # its measured (or estimated) seconds; None: nothing to go by
    files: tuple[Path, ...]
    total: int  # bytes of ``files``
    by_bytes: bool  # whether the bytes read tell how far it has got
    waking: bool


class LoadProgress:
    def __init__(
        self,
        clock: Callable[[], float],
        weights: Mapping[str, WeightFiles],
        resident: Callable[[Path], int | None],
        size: Callable[[Path], int | None],
        stage: Callable[[str, str], Stage | None] = _no_stage,
    ) -> None:
        """``weights``: each model's files; ``resident``/``size``: their bytes in the page
        cache and in all (swapgate/control/memory/pages.py, os.stat); ``stage``: (instance, model)'s
        load stage as its engine announces it (Driver.load_stage)."""
        self._clock = clock
        self._stage = stage
        self._weights = dict(weights)
        self._resident = resident
        self._size = size
        self._loads: dict[tuple[str, str], _Load] = {}
        self._last: dict[tuple[str, str], tuple[float, Figure]] = {}  # read at most so often

    def reconfigure(self, weights: Mapping[str, WeightFiles]) -> None:
        self._weights = dict(weights)

    def began(
        self, instance: str, model: str, expected: float | None, waking: bool = False
    ) -> None:
        """A load (or a wake) of ``model`` on ``instance``, expected to take ``expected`` s;
        None before any load was measured (``SwapTimes.guessing``)."""
        files = tuple(Path(f) for f in self._weights.get(model, ()))
        sizes = [self._size(f) for f in files]
        total = sum(s or 0 for s in sizes)
        read = self._read(files)
        by_bytes = bool(files) and total > 0 and not waking and read < ALREADY_READ * total
        self._loads[instance, model] = _Load(
            self._clock(),
            None if expected is None else max(expected, 0.1),
            files,
            total,
            by_bytes,
            waking,
        )

    def ended(self, instance: str, model: str) -> None:
        self._loads.pop((instance, model), None)
        self._last.pop((instance, model), None)

    def ratios(self) -> dict[tuple[str, str], float]:
        """(instance, model) of every running load: how far it has got, 0 to 1."""
        ratios = {}
        for instance, model in list(self._loads):
            figure = self.figure(instance, model)
            if figure is not None:
                ratios[instance, model] = figure.ratio
        return ratios

    def figure(self, instance: str, model: str) -> Figure | None:
        """How far the load of ``model`` on ``instance`` has got; None when none runs."""
        load = self._loads.get((instance, model))
        if load is None:
            return None
        now = self._clock()
        last = self._last.get((instance, model))
        if last is not None and now - last[0] < FRESH:  # many waiters ask: mincore once
            return last[1]
        figure = self._measure(load, now, self._stage(instance, model))
        self._last[instance, model] = (now, figure)
        return figure

    def _measure(self, load: _Load, now: float, stage: Stage | None) -> Figure:
        if load.by_bytes:
            read = min(self._read(load.files), load.total)
            ratio = min(SHOWN, read / load.total)
            return Figure(ratio, f"{_gb(read)} of {_gb(load.total)} GB read")
        if stage is not None and not load.waking:
            ratio = min(SHOWN, (stage.number - 1 + stage.value) / stage.count)
            share = f"{stage.value:.0%}"
            return Figure(ratio, f"stage {stage.number} of {stage.count} ({stage.name}), {share}")
        elapsed = now - load.began
        if load.expected is None:  # a share of a guess would be a made-up figure
            ratio = min(SHOWN, elapsed / (elapsed + EXPECTED_SWAP))
            return Figure(ratio, f"loading, {math.floor(elapsed)} s so far")
        ratio = min(SHOWN, elapsed / load.expected)
        left = load.expected - elapsed
        usual = f"{load.expected:.0f} s" if load.expected >= 1 else f"{load.expected:.1f} s"
        if left >= 0.5:
            return Figure(ratio, f"about {math.ceil(left)} s left")
        return Figure(ratio, f"{math.ceil(-left) or 1} s longer than its usual {usual}")

    def _read(self, files: tuple[Path, ...]) -> int:
        return sum(self._resident(f) or 0 for f in files)


def _gb(count: int) -> str:
    return f"{count / 1e9:.1f}"
