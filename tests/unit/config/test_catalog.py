"""Where a model's weights lie, read from the command that serves it (docs/host-cache.md)."""

from __future__ import annotations

import pytest

from swapgate.config.catalog import command_weights


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
