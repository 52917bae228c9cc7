"""What a loaded model was measured to take on its instance (docs/memory.md, "Measured memory"),
beside the size the config declares or computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where a figure came from: the GPU memory its processes hold (NVML), else its process group's
# resident memory.
Source = Literal["gpu", "rss"]
# Measured above declared by more than this share: the declared figure is wrong, and said so.
WARN_ABOVE = 0.10


@dataclass(frozen=True, slots=True)
class Footprint:
    """One reading: ``bytes`` the model takes now, and how they were read."""

    bytes: int
    source: Source


@dataclass(frozen=True, slots=True)
class Measured:
    """The largest reading since the model's last load (``loaded``: when it became warm, on the
    registry's clock); kept after it unloads, until its next load is measured."""

    bytes: int
    source: Source
    loaded: float

    def taken(self, reading: Footprint, loaded: float) -> Measured:
        """This figure with ``reading`` taken in: the larger of the two within one load, the
        reading alone from a new one."""
        if loaded != self.loaded or reading.bytes > self.bytes:
            return Measured(reading.bytes, reading.source, loaded)
        return self


def above_declared(measured: int, declared: int | None) -> bool:
    """Whether ``measured`` is more than ``WARN_ABOVE`` over a ``declared`` figure."""
    return declared is not None and measured > declared * (1 + WARN_ABOVE)
