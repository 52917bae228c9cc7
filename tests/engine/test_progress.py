"""The person waiting sees the swap (docs/operations.md, "Load progress"), against the real
llama-server (``kind: process``): a streamed chat completion with ``progress: reasoning`` is
told how many of its model's weight bytes are read, in lines that grow, then the answer; the
same request without it gets the keep-alive comments it always got and no line of progress.

The model is a real GGUF of 1.08 GB (Gemma-3-270M in F32, testbed/big_gguf.py), out of the page
cache when the load begins, which llama-server itself reads from a disk held to 300 MB/s (a
``blkio`` cgroup), as from a network volume: this machine's own disk reads it in about 0.6 s,
too fast to watch.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testbed.big_gguf import SlowReads, drop_pages, ensure_f32_gemma, slow_reads
from testbed.engines import LlamaServerEngine, ensure_llama_server, tiny_weights
from tests.e2e.processes import gateway
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine
READ = re.compile(r"([\d.]+) of ([\d.]+) GB read")


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return tiny_weights(ensure_llama_server())


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlowReads]:
    gguf = ensure_f32_gemma(ensure_llama_server())  # Gemma's own weights, not the tiny Llama's
    assert gguf.stat().st_size > 1e9, "the load must be long enough to watch"
    with slow_reads(gguf, 300e6, tmp_path_factory.mktemp("reads")) as reads:
        yield reads


def config(engine: LlamaServerEngine, big: SlowReads) -> dict[str, Any]:
    """a: the 1.08 GB GGUF, read slowly; b: the usual small one."""
    f32 = dataclasses.replace(engine, gguf=big.path)
    commands = {
        "a": {"cmd": big.join(f32.single("a", "${PORT}", ctx=512)), "ready": "/health"},
        "b": {"cmd": " ".join(engine.single("b", "${PORT}", ctx=512)), "ready": "/health"},
    }
    keepalive = {"early_headers_after": "300ms", "interval": "1s"}
    return {**process_node(commands), "keepalive": keepalive}


def stream(url: str, progress: str | None) -> list[bytes]:
    """A streamed chat completion of a, as the lines of its body."""
    body = {
        "model": "a",
        "stream": True,
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hi."}],
    }
    headers = {"x-swapgate-progress": progress} if progress else {}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120
    ) as answer:
        assert answer.status_code == 200
        return [line.encode() for line in answer.iter_lines() if line]


def told(lines: list[bytes]) -> list[str]:
    """The reasoning lines swapgate wrote (the engine writes none)."""
    said = []
    for line in lines:
        if line.startswith(b"data: {") and b"swapgate-keepalive" in line:
            said.append(json.loads(line[6:])["choices"][0]["delta"]["reasoning_content"])
    return said


def answer(lines: list[bytes]) -> str:
    """The text the model streamed."""
    chunks = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    return "".join(d.get("content") or "" for d in deltas)


def test_a_waiting_stream_is_told_the_bytes_read_then_the_answer(
    engine: LlamaServerEngine, big: SlowReads
) -> None:
    with gateway(config(engine, big)) as gw:
        drop_pages(big.path)
        with_progress = stream(gw.url, "reasoning")
        httpx.post(
            f"{gw.url}/v1/chat/completions",
            timeout=120,
            json={"model": "b", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]},
        )
        drop_pages(big.path)  # a's weights leave the page cache with it
        without = stream(gw.url, None)
    lines = told(with_progress)
    read = [float(m.group(1)) for line in lines if (m := READ.search(line))]
    print(f"\ntold: {lines}")
    assert len(read) >= 2, lines
    assert read == sorted(read), f"the figures grow: {read}"
    assert read[-1] > read[0]
    assert lines[-1].startswith("a answers after "), lines
    assert answer(with_progress), "then the model's answer"
    assert told(without) == [], "not asked: no progress"
    assert answer(without) == answer(with_progress), "the same answer (temperature 0)"
    ours = [line for line in without if not line.startswith(b"data: ")]
    assert ours, "the keep-alive comments it always got"
    assert all(line.startswith(b": swapgate") for line in ours), "and nothing else of ours"


def test_the_openai_sdk_reads_every_chunk_of_a_stream_with_progress(
    engine: LlamaServerEngine, big: SlowReads
) -> None:
    drop_pages(big.path)
    with gateway(config(engine, big)) as gw, gw.sdk() as client:
        chunks = list(
            client.chat.completions.create(
                model="a",
                stream=True,
                max_tokens=4,
                messages=[{"role": "user", "content": "Hi."}],
                extra_headers={"x-swapgate-progress": "reasoning"},
            )
        )
    reasoning = [
        c.choices[0].delta.model_extra.get("reasoning_content")
        for c in chunks
        if c.choices and c.choices[0].delta.model_extra
    ]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert any(r and "GB read" in r for r in reasoning), reasoning
    assert content, "and the answer"
