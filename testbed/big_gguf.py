"""A real GGUF of more than a gigabyte, and disk reads slow enough to watch one load.

The load-progress tests (docs/operations.md, "Load progress") need llama-server to read a GGUF of
1 GB or more from disk while swapgate counts the bytes. Gemma-3-270M in Q4_K_M is 250 MB; the
same weights dequantized to F32 are 1.08 GB and answer the same, so ``ensure_f32_gemma`` writes
that file once per machine beside the other engines (about 15 s).

This machine's disk reads a gigabyte in about 0.6 s, too fast for a line a second.
``slow_reads`` is a cgroup-v1 ``blkio`` group that caps the reads of the processes put in it
(``join``), page faults of an ``mmap`` included; where no such group can be made (no root, no
``blkio`` hierarchy), ``join`` is a reader that pages the file in at the same rate before the
engine starts, so the engine finds it read at that pace either way.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from testbed.cache import cache_root, once
from testbed.engines import LlamaServerEngine

BLKIO = Path("/sys/fs/cgroup/blkio")
READER = """
import sys, time
path, rate, chunk = sys.argv[1], float(sys.argv[2]), 16 << 20
started, done = time.monotonic(), 0
with open(path, "rb", buffering=0) as handle:
    while data := handle.read(chunk):
        done += len(data)
        time.sleep(max(0.0, done / rate - (time.monotonic() - started)))
"""


def ensure_f32_gemma(engine: LlamaServerEngine, say: bool = True) -> Path:
    """``engine``'s GGUF dequantized to F32, written once: 1.08 GB from Gemma-3-270M's Q4_K_M.
    The cached file is keyed by what it is made from (the source's name and size): an engine
    that serves other weights (``tiny_weights``'s Llama) makes another file, never this one."""
    source = engine.gguf
    root = cache_root() / f"gguf-{source.stem}-{source.stat().st_size}-f32"
    into = root / f"{source.stem}-f32.gguf"
    what = f"{source.name} in F32"
    once(root, what, say, lambda: _dequantized(source, into), "~15 s")
    return into


def _dequantized(source: Path, into: Path) -> None:
    import gguf  # the project's own dependency; only this helper needs it in testbed

    into.parent.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"]
    writer = gguf.GGUFWriter(into.with_suffix(".part"), bytes(arch.parts[arch.data[0]]).decode())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        values = [field.parts[i] for i in field.data]
        if kind == gguf.GGUFValueType.ARRAY:
            item = field.types[-1]
            text = item == gguf.GGUFValueType.STRING
            listed = [bytes(v) if text else v.tolist()[0] for v in values]
            writer.add_key_value(field.name, listed, kind, sub_type=item)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(field.name, bytes(values[0]), kind)
        else:
            writer.add_key_value(field.name, values[0].tolist()[0], kind)
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, weights.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    into.with_suffix(".part").rename(into)


def drop_pages(path: Path) -> None:
    """Take ``path``'s pages out of the page cache: the next load reads it from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class SlowReads:
    """Reads of ``path`` at ``rate`` bytes a second by the commands ``join`` wraps."""

    def __init__(self, path: Path, rate: float, group: Path | None, work: Path) -> None:
        self.path, self.rate, self.group = path, rate, group
        self._reader = work / "slow_reader.py"
        self._reader.write_text(READER)

    def join(self, command: list[str]) -> str:
        """``command`` as a shell line whose reads of the file go at the rate."""
        engine = " ".join(command)  # no word of it needs quoting; ${PORT} is swapgate's
        if self.group is not None:
            return f"sh -c 'echo $$ > {self.group}/cgroup.procs; exec {engine}'"
        read = f"{sys.executable} {self._reader} {self.path} {self.rate}"
        return f"sh -c '{read}; exec {engine}'"


@contextlib.contextmanager
def slow_reads(path: Path, rate: float, work: Path) -> Iterator[SlowReads]:
    """Cap reads of ``path``'s disk at ``rate`` bytes a second for the commands joined to it."""
    group = BLKIO / f"swapgate-test-{os.getpid()}"
    device = os.stat(path).st_dev
    try:
        group.mkdir(exist_ok=True)
        limit = f"{os.major(device)}:{os.minor(device)} {int(rate)}"
        (group / "blkio.throttle.read_bps_device").write_text(limit)
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        yield SlowReads(path, rate, None, work)
        return
    try:
        yield SlowReads(path, rate, group, work)
    finally:
        with contextlib.suppress(OSError):
            group.rmdir()  # once its last process has ended
