"""A real GGUF (Gemma-3-270M, docs/compatibility.md) read by ``gguf:`` (docs/memory.md)."""

from __future__ import annotations

import json
import subprocess

import pytest

from swapgate.config.gguf import read_gguf
from swapgate.config.loading import parse_config
from swapgate.config.sizes import size_of
from testbed.engines import LlamaCppEngine

pytestmark = pytest.mark.engine


def test_a_gguf_gives_its_true_layers_kv_size_and_weights(gemma: LlamaCppEngine) -> None:
    # The file's metadata as the engine itself reads it (llama.cpp's loader; 0.8 s, where the
    # gguf package's GGUFReader takes 11 s to build every tokenizer array first).
    script = (
        "import json, sys; from llama_cpp import Llama; "
        "m = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False); "
        "print(json.dumps(m.metadata))"
    )
    read = subprocess.run(
        [str(gemma.python), "-c", script, str(gemma.gguf)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    metadata = json.loads(read.stdout.strip().splitlines()[-1])

    def meta(key: str) -> int:
        return int(metadata[f"gemma3.{key}"])

    facts = read_gguf(str(gemma.gguf))
    assert facts.architecture == "gemma3"
    assert facts.layers == meta("block_count") == 18
    assert facts.kv_heads == meta("attention.head_count_kv")
    assert (facts.key_length, facts.value_length) == (
        meta("attention.key_length"),
        meta("attention.value_length"),
    )
    per_token = (
        meta("block_count")
        * meta("attention.head_count_kv")
        * (meta("attention.key_length") + meta("attention.value_length"))
        * 2
    )  # f16: 2 bytes per element
    assert facts.kv_per_token("f16") == per_token == 18 * 1 * (256 + 256) * 2
    assert facts.kv_per_token("q8_0") == round(per_token / 2 * 34 / 32)  # ggml's 34-byte blocks
    assert facts.context == meta("context_length")
    file_size = gemma.gguf.stat().st_size
    assert 0.95 * file_size < facts.weights < file_size  # the tensors, less the header

    settings = parse_config(
        {
            "instances": [{"name": "cpu", "url": "http://x", "memory": "1GiB"}],
            "models": {"gemma": {"gguf": str(gemma.gguf), "context": 4096, "max_seqs": 2}},
        }
    )
    size = size_of(settings.models["gemma"])
    assert size is not None
    assert size.kv == per_token * 4096 * 2
    assert size.total == round((facts.weights + size.kv) * 1.1)
