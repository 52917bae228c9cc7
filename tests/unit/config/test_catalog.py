"""Where a model's weights lie, read from the command that serves it (docs/host-cache.md), and
each model's context."""

from __future__ import annotations

from pathlib import Path

import pytest

from swapgate.config.catalog import Catalog, command_weights
from swapgate.config.loading import parse_config
from testbed.random_gguf import SHAPES, write


@pytest.mark.parametrize(
    ("cmd", "weights"),
    [
        ("llama-server -m /m/a.gguf --port ${PORT}", "/m/a.gguf"),
        ("llama-server --model=/m/a.gguf -c 512", "/m/a.gguf"),
        ("python -m llama_cpp.server --model /m/a.gguf", "/m/a.gguf"),
        ("llama-server -m models/a.gguf", None),  # relative: its folder is the engine's
        ("sh -c 'sleep 1; exec llama-server -m /m/a.gguf -c 512'", "/m/a.gguf"),
        ("/bin/bash -c 'exec llama-server --model /m/a.gguf'", "/m/a.gguf"),
        ("llama-server -c 512 --port 8080", None),  # -c of the server is its context
        ("llama-server -m 'unclosed", None),
    ],
)
def test_the_weights_a_command_loads(cmd: str, weights: str | None) -> None:
    assert command_weights(cmd) == weights


def test_each_models_context_is_its_own_else_its_gguf_headers(tmp_path: Path) -> None:
    write(tmp_path / "m.gguf", SHAPES["tiny"])  # its header says context 2048
    settings = parse_config(
        {
            "instances": [{"name": "i", "url": "http://x", "models": ["a", "b", "c", "d"]}],
            "models": {
                "a": {"gguf": str(tmp_path / "m.gguf")},
                "b": {"gguf": str(tmp_path / "m.gguf"), "context": 512},
                "c": {"context": 8192},
                "d": {"memory": "1GiB"},
            },
        }
    )
    assert Catalog(settings).contexts == {"a": 2048, "b": 512, "c": 8192}
