"""The GPU benchmark (bench/llama_server_gpu.py) is run where a machine with an NVIDIA GPU is
lent; here it runs the same way on the CPU with a tiny random model, so it is ready when one is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import llama_server_gpu
from testbed import random_gguf
from testbed.engines import ensure_llama_server

pytestmark = pytest.mark.engine


def test_the_random_model_has_the_shape_and_size_asked_for(tmp_path: Path) -> None:
    shape = random_gguf.SHAPES["tiny"]
    size = random_gguf.write(tmp_path / "m.gguf", shape)
    vocab = len(random_gguf.bytes_vocabulary().tokens)
    values = sum(_count(dims) for _, dims in random_gguf.tensors(shape, vocab))
    assert values * 2 <= size <= values * 4 + 1_000_000  # f16 weights, f32 norms, a header
    eight = random_gguf.SHAPES["8b"]
    big = sum(_count(dims) for _, dims in random_gguf.tensors(eight, vocab)) * 2
    assert 13e9 < big < 16e9  # an 8B model in f16


def test_the_benchmark_measures_loads_swaps_and_streams_on_the_cpu(tmp_path: Path) -> None:
    ensure_llama_server()
    out = tmp_path / "figures.json"
    args = [
        "--cpu",
        "--shape",
        "tiny",
        "--streams",
        "4",
        "--swaps",
        "2",
        "--rounds",
        "1",
        "--tokens",
        "16",
        "--work",
        str(tmp_path),
        "--json",
        str(out),
    ]
    assert llama_server_gpu.main(args) == 0
    figures = json.loads(out.read_text())
    assert len(figures["load_s"]) == 2
    assert all(0 < s < 60 for s in figures["load_s"])
    for kind in ("process", "llama-router"):
        assert len(figures["swaps"][kind]) == 2
        assert figures["swap_metric"][kind] > 0
    for path in ("direct", "swapgate"):
        streams = figures["streams"][path]
        assert streams["ttft_p50"] > 0
        assert streams["tokens_per_s"] > 0


def _count(dims: tuple[int, ...]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count
