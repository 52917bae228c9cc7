"""The GPU memory a set of processes holds, read through NVML (``nvidia-ml-py``) where an NVIDIA
GPU and its driver are there; nothing elsewhere (docs/memory.md, "Measured memory").

NVML is imported and initialised at the first reading, not before: a host without the package,
the driver library or a GPU reads 0 for every process, once told in the log. NVML names
processes by their pids as the host sees them; in a container without the host's PID namespace
they do not match, and the reading is 0 (the resident size then stands alone).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger("swapgate.memory")


def import_nvml() -> Any:
    """``pynvml`` (the ``nvidia-ml-py`` package), or None where it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class GpuMemory:
    """Reads what processes hold on every NVIDIA GPU of this host; 0 where NVML is missing."""

    def __init__(self, load: Callable[[], Any] = import_nvml) -> None:
        self._load = load
        self._nvml: Any = None
        self._tried = False
        self._failed = False  # a reading failed once: told once, not at every poll

    def held_by(self, pids: Collection[int]) -> int:
        """The bytes of GPU memory that ``pids`` hold together, on every GPU."""
        nvml = self._started()
        if nvml is None or not pids:
            return 0
        try:
            return sum(_held_on(nvml, index, pids) for index in range(nvml.nvmlDeviceGetCount()))
        except Exception as exc:  # NVMLError's subclasses are made at run time
            if not self._failed:
                log.warning("reading GPU memory through NVML failed (%s); reading 0", exc)
                self._failed = True
            return 0

    def _started(self) -> Any:
        if not self._tried:
            self._tried = True
            self._nvml = self._init()
        return self._nvml

    def _init(self) -> Any:
        nvml = self._load()
        if nvml is None:
            log.debug("no nvidia-ml-py: GPU memory is not measured, resident size alone")
            return None
        try:
            nvml.nvmlInit()
        except Exception as exc:  # no driver library, no GPU: NVMLError_LibraryNotFound, …
            log.info("NVML is not usable here (%s): GPU memory is not measured", exc)
            return None
        return nvml


def _held_on(nvml: Any, index: int, pids: Collection[int]) -> int:
    """What ``pids`` hold on GPU ``index``: each pid once, compute or graphics (a process with
    both contexts is listed twice)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    held: dict[int, int] = {}
    for listed in (
        nvml.nvmlDeviceGetComputeRunningProcesses,
        nvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        for proc in listed(handle):
            used = proc.usedGpuMemory  # None where the driver does not say (some vGPUs)
            if proc.pid in pids and used:
                held[proc.pid] = max(held.get(proc.pid, 0), int(used))
    return sum(held.values())
