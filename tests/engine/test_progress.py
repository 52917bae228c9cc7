"""The person waiting sees the swap (docs/operations.md, "Load progress"), against the real
llama-server (``kind: process``): a streamed chat completion with ``progress: reasoning`` is
told how many of its model's weight bytes are read, in lines that grow, then the answer; the
same request without it gets the keep-alive comments it always got and no line of progress.

The model's weights are a 1 GiB file (``weights``), not in the page cache when the load begins,
read by the command before it starts llama-server at 300 MB/s, as from a network volume: this
machine's own disk reads 1 GiB in about half a second, too fast to watch.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.engines import LlamaServerEngine, ensure_llama_server
from tests.e2e.processes import gateway
from tests.engine.conftest import process_node

pytestmark = pytest.mark.engine
READER = """
import sys, time
path, rate, chunk = sys.argv[1], float(sys.argv[2]), 16 << 20
started, done = time.monotonic(), 0
with open(path, "rb", buffering=0) as handle:
    while data := handle.read(chunk):
        done += len(data)
        time.sleep(max(0.0, done / rate - (time.monotonic() - started)))
"""
READ = re.compile(r"([\d.]+) of ([\d.]+) GB read")


@pytest.fixture(scope="module")
def engine() -> LlamaServerEngine:
    return ensure_llama_server()


def config(engine: LlamaServerEngine, root: Path) -> dict[str, Any]:
    weights = root / "weights.bin"
    with weights.open("wb") as handle:
        handle.truncate(1 << 30)  # a hole: no page of it is in the cache until it is read
    (root / "reader.py").write_text(READER)
    server = " ".join(engine.single("${MODEL}", "${PORT}"))
    read = f"{sys.executable} {root / 'reader.py'} {weights} 300e6"
    commands = {
        "a": {"cmd": f"sh -c '{read}; exec {server.replace('${MODEL}', 'a')}'", "ready": "/health"},
        "b": {"cmd": server.replace("${MODEL}", "b"), "ready": "/health"},
    }
    keepalive = {"early_headers_after": "300ms", "interval": "1s"}
    return {
        **process_node(commands),
        "keepalive": keepalive,
        "models": {"a": {"weights": str(weights)}},
    }


def stream(url: str, progress: str | None) -> list[bytes]:
    """A streamed chat completion of a, as the lines of its body."""
    body = {
        "model": "a",
        "stream": True,
        "max_tokens": 4,
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


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_waiting_stream_is_told_the_bytes_read_then_the_answer(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    settings = config(engine, tmp_path)
    with gateway(settings) as gw:
        with_progress = stream(gw.url, "reasoning")
        httpx.post(
            f"{gw.url}/v1/chat/completions",
            timeout=120,
            json={"model": "b", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]},
        )
        drop(tmp_path / "weights.bin")  # a's weights leave the page cache with it
        without = stream(gw.url, None)
    lines = told(with_progress)
    read = [float(m.group(1)) for line in lines if (m := READ.search(line))]
    print(f"\ntold: {lines}")
    assert len(read) >= 2, lines
    assert read == sorted(read), f"the figures grow: {read}"
    assert read[-1] > read[0]
    assert lines[-1].startswith("a answers after "), lines
    answer = [
        line for line in with_progress if line.startswith(b"data: {") and b'"content"' in line
    ]
    assert answer, "then the model's answer"
    assert told(without) == [], "not asked: no progress"
    kept_alive = [line for line in without if line.startswith(b": swapgate")]
    assert kept_alive, "the keep-alive comments it always got"
    assert all(not line.startswith(b"data: {") or b"swapgate" not in line for line in without)


def test_the_openai_sdk_reads_every_chunk_of_a_stream_with_progress(
    engine: LlamaServerEngine, tmp_path: Path
) -> None:
    with gateway(config(engine, tmp_path)) as gw, gw.sdk() as client:
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
