"""The engines the suite builds run on any x86-64 machine with AVX2 (testbed/engines.py):
no AVX-512 or AMX instruction is compiled in, whatever CPU built them."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.engines import ensure_llama_cpp, ensure_llama_server

pytestmark = pytest.mark.engine
# AVX-512's registers, and AMX's tile instructions (tdpbf16ps, tdpbssd, tileloadd, ...), as
# GNU grep's extended expression: grep reads llama-server's 2.3 million lines of listing in a
# tenth of the CPU Python's re took (2.4 s in all against ~9).
BEYOND_BASELINE = r"%zmm|%k[0-7]\b|\btdp|\btile(load|store|zero|cfg)"


def instructions_beyond_the_baseline(binary: Path) -> list[str]:
    objdump, grep = shutil.which("objdump"), shutil.which("grep")
    assert objdump, "objdump (binutils, which the engine builds need too)"
    assert grep
    listing = subprocess.Popen(
        [objdump, "-d", "--no-show-raw-insn", str(binary)], stdout=subprocess.PIPE
    )
    assert listing.stdout is not None
    with listing.stdout:
        found = subprocess.run(
            [grep, "-m", "5", "-E", BEYOND_BASELINE],
            stdin=listing.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
    disassembled = listing.wait()
    assert found.returncode in (0, 1), found.stderr  # 1: no line matched
    if found.returncode == 1:  # grep read it all: objdump must have written it all
        assert disassembled == 0, f"objdump -d {binary} exited with {disassembled}"
    return [line.strip() for line in found.stdout.splitlines()]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 baseline")
def test_the_llama_engines_hold_no_avx512_or_amx_instruction() -> None:
    server = ensure_llama_server().binary
    cpp = ensure_llama_cpp().python.parent.parent
    (ggml_cpu,) = {
        p.resolve() for p in cpp.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-cpu.so")
    }
    for binary in (server, ggml_cpu):
        assert instructions_beyond_the_baseline(binary) == [], binary


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 baseline")
def test_the_check_finds_avx512_and_amx_in_a_binary_that_has_them(tmp_path: Path) -> None:
    assembler = shutil.which("as")
    assert assembler, "as (binutils, which the engine builds need too)"
    source = tmp_path / "beyond.s"
    source.write_text(
        "vpaddd %xmm0, %xmm1, %xmm2\n"  # AVX2's: allowed
        "vpaddd %zmm0, %zmm1, %zmm2\n"
        "kmovw %k1, %eax\n"
        "tdpbf16ps %tmm0, %tmm1, %tmm2\n"
        "tileloadd (%rax,%rbx,1), %tmm3\n"
    )
    subprocess.run([assembler, "-o", str(tmp_path / "beyond.o"), str(source)], check=True)
    found = instructions_beyond_the_baseline(tmp_path / "beyond.o")
    assert [line.split(":", 1)[1].split()[0] for line in found] == [
        "vpaddd",
        "kmovw",
        "tdpbf16ps",
        "tileloadd",
    ], found
