"""``python -m testbed [ENGINE|all]``: build (once per machine) and check the engines and
clients the tests and benchmarks run (``make engine``)."""

from __future__ import annotations

import sys

from testbed.engines import (
    LLAMA_SWAP_ENV,
    EngineBroken,
    ensure_clis,
    ensure_llama_cpp,
    ensure_llama_server,
    ensure_llama_swap,
    ensure_ollama_chat_ui,
    ensure_ollama_js,
    ensure_openai_js,
    ensure_vllm,
)
from testbed.traces import ensure_trace_backend

ENGINES = ("llama-cpp-python", "llama-server", "vllm", "clis", "llama-swap", "traces")


def main(argv: list[str]) -> None:
    which = argv[0] if argv else "all"
    if which not in ("all", *ENGINES):
        raise SystemExit(f"usage: python -m testbed [{'|'.join(ENGINES)}|all]")
    try:
        _ensure(which)
    except EngineBroken as exc:
        raise SystemExit(f"error: {exc}") from None


def _ensure(which: str) -> None:
    if which in ("all", "llama-cpp-python"):
        print(ensure_llama_cpp().python.parent.parent)
    if which in ("all", "llama-server"):
        print(ensure_llama_server().binary.parent.parent)
    if which in ("all", "vllm"):
        print(ensure_vllm().vllm.parent.parent)
    if which in ("all", "clis"):
        print(ensure_clis().claude.parent.parent.parent)
        print(ensure_openai_js())
        print(ensure_ollama_js())
        print(ensure_ollama_chat_ui())
    if which in ("all", "llama-swap"):
        swap = ensure_llama_swap()
        print(
            swap.binary
            if swap
            else f"llama-swap: none (no ../shared/engines/llama-swap, no "
            f"{LLAMA_SWAP_ENV}): its tests are skipped"
        )
    if which in ("all", "traces"):  # the trace backend the tracing tests read (testbed/traces.py)
        print(ensure_trace_backend())


if __name__ == "__main__":
    main(sys.argv[1:])
