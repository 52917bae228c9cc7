"""``kind: process``: swapgate runs one server process per warm model itself
(docs/configuration.md).

Load starts the model's command in a process group of its own, on a free port from
``start_port`` up, and waits until its ``ready`` path answers 200; unload sends the group
SIGTERM, SIGKILL after ``stop_timeout``, and waits for it. The coordinator bounds a load by
``routing.swap_timeout``: a load cut short stops what it started.

No process outlives swapgate: ``aclose`` stops them all at shutdown; if swapgate dies instead
(SIGKILL included), each gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and its whole group is
stopped by the ``Ledger``'s guard, SIGKILL after ``stop_timeout``; the ledger's records catch
what even that missed at the next start. What happens is told to the ``ProcessEvents`` given at
construction (the runtime's: swapgate/server/runtime.py): a process that exits on its own
(``exited``: the model goes cold; its last output lines stay readable), every process group's
resident size at each poll (``measured``), and one above its command's ``recycle_rss``
(``oversize``), which the runtime recycles. Each poll's report carries what every ready model
takes: the GPU memory its group holds (NVML, swapgate/drivers/gpu_memory.py), else its resident
size (docs/memory.md, "Measured memory").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import httpx
import psutil

from swapgate.config.settings import InstanceConfig, ProcessCommand
from swapgate.data.footprint import Footprint
from swapgate.data.warm import InstanceReport, WarmState
from swapgate.drivers.base import Driver
from swapgate.drivers.children import die_with_parent, exit_name, port_free
from swapgate.drivers.gpu_memory import GpuMemory
from swapgate.drivers.ledger import Ledger
from swapgate.errors import DriverError

log = logging.getLogger("swapgate.process")
OUTPUT_LINES = 50  # kept per process, for errors and /admin/state
READY_POLL = 0.2  # seconds between readiness checks while a process starts
SHELL_CHARS = set("|&;<>()$`\\\"'*?[]#~=%{}\n")


@dataclass
class Running:
    """One model's server process."""

    model: str
    port: int
    process: asyncio.subprocess.Process
    output: deque[str] = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    ready: bool = False
    stopping: bool = False
    started: float = field(default_factory=time.monotonic)
    watchers: list[asyncio.Task[None]] = field(default_factory=list)

    def last_lines(self, count: int = 10) -> str:
        return "\n".join(list(self.output)[-count:]) or "(no output)"


class ProcessEvents(Protocol):
    """What a process instance tells of its processes."""

    def exited(self, model: str, code: int) -> None:
        """A process exited on its own (not stopped by swapgate)."""

    def measured(self, model: str, rss: int | None, command: ProcessCommand | None) -> None:
        """Each poll: a ready process's group resident size in bytes, and the command it runs
        under now (its limits); None once it ended."""

    def oversize(self, model: str, rss: int) -> None:
        """Each poll while a process's group is above its command's ``recycle_rss``."""


class Unwatched:
    """Events nobody listens to (a driver made outside a gateway: tests, tools)."""

    def exited(self, model: str, code: int) -> None:
        pass

    def measured(self, model: str, rss: int | None, command: ProcessCommand | None) -> None:
        pass

    def oversize(self, model: str, rss: int) -> None:
        pass


class ProcessDriver(Driver):
    kind = "process"

    cancels_loads = True  # a load cancelled stops the process it started

    def __init__(
        self,
        instance: InstanceConfig,
        client: httpx.AsyncClient,
        events: ProcessEvents | None = None,
        ledger: Ledger | None = None,
        gpu: GpuMemory | None = None,
    ) -> None:
        super().__init__("http://127.0.0.1", client, None, discover=False)
        self.instance = instance.name
        self._commands = dict(instance.commands)
        self._start_port = instance.start_port
        self._kv_dir = instance.kv_folder
        self._running: dict[str, Running] = {}
        self._exited: dict[str, deque[str]] = {}  # the last output of processes that ended
        self._events = events or Unwatched()
        self._ledger = ledger or Ledger(None)  # what it started, for a sweep after a crash
        self._gpu = gpu or GpuMemory()  # NVML, where there is one: read at the first poll

    # -- the driver interface ----------------------------------------------------------------

    async def state(self) -> InstanceReport:
        running = {
            model: WarmState.WARM if proc.ready else WarmState.LOADING
            for model, proc in self._running.items()
            if not proc.stopping
        }
        measured = await self._measure()
        return InstanceReport(running=running, available=None, measured=measured)

    async def load(self, model: str) -> None:
        command = self._command(model)
        for attempt in (1, 2):
            proc = await self._start(model, command)
            try:
                await self._until_ready(proc, command)
            except BaseException as exc:  # failed, swap_timeout or cancelled: stop what started
                # The port was free when chosen, but something bound it before the server did
                # (an engine binds only once its model is loaded): once more, on another port.
                taken = isinstance(exc, DriverError) and not port_free(proc.port)
                await self._stop(proc, command.stop_timeout)
                if taken and attempt == 1:
                    log.warning(
                        "%s/%s: port %d was taken while it started; once more on another",
                        self.instance,
                        model,
                        proc.port,
                    )
                    continue
                raise
            break
        proc.ready = True
        log.info(
            "%s/%s serving on port %d (pid %d)", self.instance, model, proc.port, proc.process.pid
        )

    async def unload(self, model: str) -> None:
        proc = self._running.get(model)
        if proc is not None:
            await self._stop(proc, self._command(model).stop_timeout)

    def model_url(self, model: str) -> str | None:
        proc = self._running.get(model)
        return f"http://127.0.0.1:{proc.port}" if proc else None

    # -- operators ---------------------------------------------------------------------------

    def output(self, model: str) -> list[str]:
        """The last lines the model's process wrote (or, once it ended, its last ones)."""
        proc = self._running.get(model)
        lines = proc.output if proc else self._exited.get(model, ())
        return list(lines)

    def describe(self) -> dict[str, dict[str, object]]:
        """Per model: its process (pid, port, ready) if one runs, and its last output lines."""
        described: dict[str, dict[str, object]] = {}
        for model in self._commands:
            proc = self._running.get(model)
            running = (
                {"pid": proc.process.pid, "port": proc.port, "ready": proc.ready} if proc else {}
            )
            described[model] = {**running, "output": self.output(model)}
        return described

    def reconfigure(self, instance: InstanceConfig) -> None:
        """Take a reloaded config: running processes keep running; new loads use it."""
        self._commands = dict(instance.commands)
        self._start_port = instance.start_port
        self._kv_dir = instance.kv_folder

    async def aclose(self) -> None:
        await asyncio.gather(
            *(self._stop(proc, self._command(m).stop_timeout) for m, proc in self._running.items())
        )

    # -- processes ---------------------------------------------------------------------------

    async def _measure(self) -> dict[str, Footprint]:
        """Each ready model's group: its resident size told to the events, and what it takes
        (its GPU memory where it holds some, else its resident size) for the report."""
        ready = {m: p for m, p in self._running.items() if p.ready and not p.stopping}
        readings = await asyncio.to_thread(
            lambda: {m: self._read(p.process.pid) for m, p in ready.items()}
        )
        taken: dict[str, Footprint] = {}
        for model, (rss, gpu) in readings.items():
            if self._running.get(model) is not ready[model]:
                continue  # stopped while it was measured
            command = self._commands.get(model)
            self._events.measured(model, rss, command)
            limit = command.recycle_rss if command is not None else None
            if limit is not None and rss > limit:
                self._events.oversize(model, rss)
            if gpu or rss:
                taken[model] = Footprint(gpu, "gpu") if gpu else Footprint(rss, "rss")
        return taken

    def _read(self, pid: int) -> tuple[int, int]:
        """The resident size and the GPU memory of ``pid``'s group (a thread's work)."""
        members = group_members(pid)
        return resident(members), self._gpu.held_by({m.pid for m in members})

    def _command(self, model: str) -> ProcessCommand:
        try:
            return self._commands[model]
        except KeyError:
            raise DriverError(f"{self.instance} has no command for {model!r}") from None

    async def _start(self, model: str, command: ProcessCommand) -> Running:
        port = self._free_port()
        line = command.cmd.replace("${PORT}", str(port))
        if self._kv_dir is not None:  # kv_keep: llama-server saves and restores slots there
            self._kv_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            line += f" --slot-save-path {shlex.quote(str(self._kv_dir))}"
        # No shell unless the command needs one; with one, exec makes the server the leader.
        argv = ["/bin/sh", "-c", "exec " + line] if SHELL_CHARS & set(line) else shlex.split(line)
        env = {**os.environ, **command.env, "PORT": str(port)}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group: unload stops all of it
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            raise DriverError(f"cannot start {model!r} on {self.instance}: {exc}") from exc
        proc = Running(model, port, process)
        self._running[model] = proc
        self._ledger.record(process.pid, self.instance, model, command.stop_timeout)
        log.info(
            "%s/%s starting on port %d (pid %d): %s", self.instance, model, port, process.pid, line
        )
        proc.watchers.append(asyncio.create_task(self._read_output(proc)))
        proc.watchers.append(asyncio.create_task(self._watch_exit(proc)))
        return proc

    async def _until_ready(self, proc: Running, command: ProcessCommand) -> None:
        url = f"http://127.0.0.1:{proc.port}{command.ready}"
        while True:
            if proc.process.returncode is not None:
                with contextlib.suppress(TimeoutError):  # its last words, read to the end
                    await asyncio.wait_for(asyncio.shield(proc.watchers[0]), 1.0)
                how = exit_name(proc.process.returncode)
                raise DriverError(
                    f"{proc.model} exited with {how} while starting on {self.instance}; its "
                    f"last output:\n{proc.last_lines()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                response = await self._client.get(url, timeout=2.0)
                if response.status_code == 200:
                    return
            await asyncio.sleep(READY_POLL)

    async def _stop(self, proc: Running, timeout: float) -> None:
        proc.stopping = True
        if proc.process.returncode is None:
            _signal_group(proc.process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.process.wait(), timeout)
            except TimeoutError:
                log.warning(
                    "%s/%s ignored SIGTERM for %gs: SIGKILL", self.instance, proc.model, timeout
                )
                _signal_group(proc.process.pid, signal.SIGKILL)
                await proc.process.wait()
        # A server's own children (workers) share its group: none may stay behind.
        _signal_group(proc.process.pid, signal.SIGKILL)
        await asyncio.gather(*proc.watchers, return_exceptions=True)
        self._forget(proc)

    async def _read_output(self, proc: Running) -> None:
        assert proc.process.stdout is not None
        prefix = f"{self.instance}/{proc.model}"
        async for raw in proc.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            proc.output.append(line)
            log.debug("%s: %s", prefix, line)

    async def _watch_exit(self, proc: Running) -> None:
        code = await proc.process.wait()
        if proc.stopping:
            return
        log.warning(
            "%s/%s exited by itself with %s; its last output:\n%s",
            self.instance,
            proc.model,
            exit_name(code),
            proc.last_lines(),
        )
        _signal_group(proc.process.pid, signal.SIGKILL)
        was_ready = proc.ready
        self._forget(proc)
        if was_ready:  # a start that fails is the load's error, not an exit
            self._events.exited(proc.model, code)

    def _forget(self, proc: Running) -> None:
        if self._running.get(proc.model) is proc:
            del self._running[proc.model]
            self._exited[proc.model] = proc.output
            self._ledger.forget(proc.process.pid)
            self._events.measured(proc.model, None, None)

    def _free_port(self) -> int:
        taken = {proc.port for proc in self._running.values()}
        for port in range(self._start_port, 65536):
            if port not in taken and port_free(port):
                return port
        raise DriverError(f"no free port from {self._start_port} up on {self.instance}")


def group_members(pid: int) -> list[psutil.Process]:
    """``pid`` and everything it started; none once it is gone."""
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def resident(members: list[psutil.Process]) -> int:
    """The resident size of ``members`` together (those gone meanwhile count nothing)."""
    total = 0
    for member in members:
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return total


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
