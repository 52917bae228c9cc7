"""The engines the suite builds run on any x86-64 machine with AVX2 (testbed/engines.py):
no AVX-512 or AMX instruction is compiled in, whatever CPU built them."""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.engines import ensure_llama_cpp, ensure_llama_server

pytestmark = pytest.mark.engine
# AVX-512's registers, and AMX's tile instructions (tdpbf16ps, tdpbssd, tileloadd, ...)
BEYOND_BASELINE = re.compile(r"%zmm|%k[0-7]\b|\btdp|\btile(load|store|zero|cfg)")


def instructions_beyond_the_baseline(binary: Path) -> list[str]:
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils, which the engine builds need too)"
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(binary)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.strip() for line in listing.splitlines() if BEYOND_BASELINE.search(line)][:5]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 baseline")
def test_the_llama_engines_hold_no_avx512_or_amx_instruction() -> None:
    server = ensure_llama_server().binary
    cpp = ensure_llama_cpp().python.parent.parent
    (ggml_cpu,) = {
        p.resolve() for p in cpp.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-cpu.so")
    }
    for binary in (server, ggml_cpu):
        assert instructions_beyond_the_baseline(binary) == [], binary
