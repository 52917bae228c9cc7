"""The GPU memory a model's processes hold, read through NVML (swapgate/drivers/gpu_memory.py),
with a fake ``pynvml`` module: no GPU here. And the process driver's reading of what a ready
model takes: its GPU memory where its group holds some, else its resident size."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from swapgate.config.loading import parse_config
from swapgate.data.footprint import Footprint
from swapgate.drivers.gpu_memory import GpuMemory, import_nvml
from swapgate.drivers.process import ProcessDriver, Running

GiB = 2**30


class NVMLError(Exception):
    pass


class FakeNvml:
    """``pynvml``'s calls that swapgate makes, over a table of GPUs and their processes."""

    def __init__(self, gpus: list[dict[str, list[tuple[int, int | None]]]]) -> None:
        self.gpus = gpus
        self.inits = 0
        self.fail_init: Exception | None = None
        self.fail_read: Exception | None = None

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.fail_init is not None:
            raise self.fail_init

    def nvmlDeviceGetCount(self) -> int:
        if self.fail_read is not None:
            raise self.fail_read
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return self._listed(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[Any]:
        return self._listed(handle, "graphics")

    def _listed(self, handle: int, kind: str) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self.gpus[handle].get(kind, [])]


def test_the_memory_a_group_holds_is_summed_over_every_gpu() -> None:
    nvml = FakeNvml(
        [
            {"compute": [(10, 8 * GiB), (99, 30 * GiB)]},  # 99: another model's process
            {"compute": [(11, 6 * GiB)], "graphics": [(11, 6 * GiB)]},  # listed twice: once
        ]
    )
    gpu = GpuMemory(lambda: nvml)
    assert gpu.held_by({10, 11}) == 14 * GiB
    assert gpu.held_by({12}) == 0
    assert nvml.inits == 1, "NVML is started once, at the first reading"


def test_a_process_whose_memory_the_driver_does_not_say_counts_nothing() -> None:
    gpu = GpuMemory(lambda: FakeNvml([{"compute": [(10, None)]}]))
    assert gpu.held_by({10}) == 0


def test_without_nvidia_ml_py_nothing_is_read_and_nothing_fails() -> None:
    loads = []
    gpu = GpuMemory(lambda: loads.append(1))  # returns None: the package is not installed
    assert gpu.held_by({10}) == 0
    assert gpu.held_by({10}) == 0
    assert loads == [1], "looked for once, not at every poll"


def test_the_real_import_finds_no_package_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if not installed, whatever is
    assert import_nvml() is None


def test_nvml_without_a_driver_or_gpu_is_told_once_and_reads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([])
    nvml.fail_init = NVMLError("NVML Shared Library Not Found")
    gpu = GpuMemory(lambda: nvml)
    caplog.set_level(logging.INFO, "swapgate.memory")
    assert gpu.held_by({10}) == 0
    assert gpu.held_by({10}) == 0
    assert nvml.inits == 1
    [told] = [r.getMessage() for r in caplog.records]
    assert "NVML is not usable here" in told
    assert "Library Not Found" in told


def test_a_reading_that_fails_reads_nothing_and_is_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvml = FakeNvml([{"compute": [(10, GiB)]}])
    gpu = GpuMemory(lambda: nvml)
    assert gpu.held_by({10}) == GiB
    nvml.fail_read = NVMLError("GPU is lost")
    caplog.set_level(logging.WARNING, "swapgate.memory")
    assert gpu.held_by({10}) == 0
    assert gpu.held_by({10}) == 0
    assert len(caplog.records) == 1
    assert "GPU is lost" in caplog.records[0].getMessage()


class HeldBy(GpuMemory):
    """A GPU on which the processes named hold ``held`` bytes each."""

    def __init__(self, held: int) -> None:
        super().__init__()
        self.held = held
        self.asked: list[set[int]] = []

    def held_by(self, pids: Collection[int]) -> int:
        self.asked.append(set(pids))
        return self.held * len(pids)


async def _reported(gpu: HeldBy) -> tuple[dict[str, Footprint], int]:
    """A process driver's poll with one real process ready as ``m``: what it reports."""
    conf = parse_config(
        {"instances": [{"name": "p", "kind": "process", "commands": {"m": "true"}}]}
    ).instances[0]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)"
    )
    async with httpx.AsyncClient() as client:
        driver = ProcessDriver(conf, client, gpu=gpu)
        driver._running["m"] = Running("m", 1, child, ready=True)
        try:
            report = await driver.state()
        finally:
            child.kill()
            await child.wait()
    return dict(report.measured or {}), child.pid


async def test_a_ready_process_is_reported_by_its_resident_size_without_a_gpu() -> None:
    measured, _ = await _reported(HeldBy(0))
    assert measured["m"].source == "rss"
    assert 1 << 20 < measured["m"].bytes < 1 << 30, "a Python process's resident size"


async def test_a_process_holding_gpu_memory_is_reported_by_it() -> None:
    gpu = HeldBy(5 * GiB)
    measured, pid = await _reported(gpu)
    assert measured["m"] == Footprint(5 * GiB, "gpu")
    assert gpu.asked == [{pid}], "its process group's pids"
