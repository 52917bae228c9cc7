"""The walk of one warm request through the package: which of swapgate's files its frames enter,
in order, from the proxied endpoint's ``__call__`` to its return; a step each time the innermost
file of swapgate's changes by a call, a return each time it changes back, and how often the
handler is entered again. What a reader follows to read one request.

``python -m bench.walk`` walks this tree; ``PYTHONPATH=EXPORT python -P -m bench.walk`` walks
an exported commit's package (bench/procs.py ``export``) with this tree's tool.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import uvicorn

from bench.procs import fixed_upstream
from bench.warm import config_for
from swapgate.config.loading import parse_config
from swapgate.server.app import create_app
from swapgate.tools.processes import free_port

HANDLER = "proxy/handler.py"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Walk:
    files: list[str] = field(default_factory=list)  # the innermost file, each time it changes
    steps: int = 0
    returns: int = 0

    def visited(self) -> Counter[str]:
        return Counter(self.files)

    def handler_entries(self) -> int:
        return self.files.count(HANDLER)


def _package_file(frame: FrameType) -> str | None:
    path = frame.f_code.co_filename
    marker = "/swapgate/"
    at = path.rfind(marker)
    return path[at + len(marker) :] if at >= 0 else None


def _recorder(walk: Walk, task: list[asyncio.Task[Any] | None]) -> Any:
    """A profile hook that follows the request's own task only."""

    def hook(frame: FrameType, event: str, _: object) -> None:
        if event not in ("call", "return"):
            return
        here = _package_file(frame)
        if here is None:
            return
        current = asyncio.current_task()
        if task[0] is None:
            if event == "call" and here == HANDLER and frame.f_code.co_name == "__call__":
                task[0] = current
                walk.files.append(here)
            return
        if current is not task[0]:
            return
        if event == "call":
            if walk.files[-1] != here:
                walk.files.append(here)
                walk.steps += 1
        else:
            caller = frame.f_back
            back = _package_file(caller) if caller is not None else None
            if back is not None and back != here and walk.files[-1] != back:
                walk.files.append(back)
                walk.returns += 1

    return hook


async def _walk(upstream: str) -> Walk:
    port = free_port()
    settings = parse_config({**config_for(upstream), "server": {"port": port}})
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_config=None)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn sets a flag, no event)
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    walk, task = Walk(), list[asyncio.Task[Any] | None]([None])
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm: connections made, first-call caches filled
            async with session.post(url, json=BODY) as answer:
                await answer.read()
        sys.setprofile(_recorder(walk, task))
        try:
            async with session.post(url, json=BODY) as answer:
                await answer.read()
        finally:
            sys.setprofile(None)
    server.should_exit = True
    await serving
    return walk


def main() -> None:
    with fixed_upstream() as upstream:
        walk = asyncio.run(_walk(upstream.url))
    visited = walk.visited()
    print(f"package: {Path(sys.modules['swapgate'].__file__ or '').parent}")
    print(
        f"{len(visited)} files, {walk.steps} steps, {walk.returns} returns, "
        f"{HANDLER} entered {walk.handler_entries()} times"
    )
    print(" → ".join(walk.files))


if __name__ == "__main__":
    main()
