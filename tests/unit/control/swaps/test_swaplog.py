"""The swap log names the swap a request waited for: the latest of its model on its instance."""

from __future__ import annotations

from swapgate.control.swaps.swaplog import SwapLog


def test_the_latest_swap_of_a_model_onto_an_instance() -> None:
    log = SwapLog()
    first = log.begin("gpu-a", "qwen", "load", (), "", 5.0)
    other = log.begin("gpu-b", "qwen", "load", (), "", 5.0)
    log.end(first, "ok", 4.0)
    again = log.begin("gpu-a", "qwen", "load", ("llama",), "residency", 5.0)
    assert log.last_of("gpu-a", "qwen") == again.id
    assert log.last_of("gpu-b", "qwen") == other.id
    assert log.last_of("gpu-a", "llama") is None
    assert len({first.id, other.id, again.id}) == 3
