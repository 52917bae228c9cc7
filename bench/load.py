"""Load generators: wrk for request/response, an asyncio client for many slow streams."""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass

import aiohttp

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-key"
"""
SOCKET_ERRORS = r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


@dataclass(frozen=True)
class WrkResult:
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def wrk(url: str, connections: int, seconds: float) -> WrkResult:
    binary = shutil.which("wrk") or "/usr/bin/wrk"
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(WRK_SCRIPT)
        script.flush()
        threads = min(2, connections)
        output = subprocess.run(
            [
                binary,
                f"-t{threads}",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--latency",
                "-s",
                script.name,
                url + "/v1/chat/completions",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return _parse_wrk(output)


def _parse_wrk(output: str) -> WrkResult:
    def latency(percent: str) -> float:
        match = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$", output, re.MULTILINE)
        assert match, output
        return float(match[1]) * _UNITS[match[2]]

    requests = re.search(r"(\d+) requests in", output)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    assert requests, output
    assert rps, output
    failed = int(errors[1]) if errors else 0
    failed += sum(int(n) for n in socket_errors.groups()) if socket_errors else 0
    return WrkResult(int(requests[1]), float(rps[1]), latency("50"), latency("99"), failed)


@dataclass(frozen=True)
class StreamResult:
    streams: int
    chunks: int
    gap_p50_ms: float
    gap_p99_ms: float
    failed: int


async def _streams(url: str, streams: int, tokens: int) -> StreamResult:
    body = {"model": "m", "messages": [], "stream": True, "max_tokens": tokens}
    connector = aiohttp.TCPConnector(limit=0)
    gaps: list[float] = []
    failed = 0
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> int:
            nonlocal failed
            last = None
            count = 0
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append((now - last) * 1000)
                    last, count = now, count + 1
            if count < tokens:
                failed += 1
            return count

        counts = await asyncio.gather(*(one() for _ in range(streams)))
    quantiles = statistics.quantiles(gaps, n=100)
    return StreamResult(streams, sum(counts), quantiles[49], quantiles[98], failed)


def streams(url: str, streams: int, tokens: int) -> StreamResult:
    return asyncio.run(_streams(url, streams, tokens))
