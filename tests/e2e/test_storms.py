"""Many clients at once (issue 15): a disconnect storm and 1,000 concurrent streams, after
which the gateway holds no more descriptors than before and its memory has stopped growing."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from tests.e2e.processes import Gateway, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
STREAM = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1])


async def _streams(gw: Gateway, count: int, max_tokens: int, leave_after_first: bool) -> list[str]:
    """``count`` streams at once, each on its own connection; what each one ended with."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> str:
            body = {**STREAM, "max_tokens": max_tokens}
            async with session.post(f"{gw.url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                last = ""
                async for line in response.content:
                    if line.startswith(b"data: "):
                        last = line.decode().strip()
                        if leave_after_first:
                            return "left"
                return last

        return await asyncio.gather(*(one() for _ in range(count)))


def test_a_disconnect_storm_and_1000_concurrent_streams_leave_nothing_behind() -> None:
    with simulator(load_time=0.1, token_rate=20) as sim:
        config = {"instances": [instance("gpu-a", sim)], "server": {"access_log": False}}
        with gateway(config) as gw:
            pid = gw.process.pid
            asyncio.run(_streams(gw, 1, 2, False))  # warm: the model loaded, pools made
            fds_before = _fds(pid)

            # 200 clients leave after their first chunk of a 10 s answer.
            left = asyncio.run(_streams(gw, 200, 200, True))
            wait_for(lambda: sim.stats()["active"] == 0, timeout=20)
            stats = sim.stats()
            wait_for(lambda: 'swapgate_inflight_requests{instance="gpu-a"} 0.0' in gw.metrics())

            ends = asyncio.run(_streams(gw, 1000, 3, False))
            rss_after_first = _rss_kib(pid)
            again = asyncio.run(_streams(gw, 1000, 3, False))
            rss_after_second = _rss_kib(pid)
            wait_for(lambda: _fds(pid) <= fds_before + 2, timeout=15)
            fds_after = _fds(pid)
            metrics = gw.metrics()
    assert left == ["left"] * 200
    assert stats["cancelled"] == 200  # every generation stopped with its client
    assert ends == ["data: [DONE]"] * 1000
    assert again == ["data: [DONE]"] * 1000
    assert fds_after <= fds_before + 2
    # A leak grows with every burst; an allocator's high-water mark does not.
    assert rss_after_second - rss_after_first < 8 * 1024  # KiB
    assert 'swapgate_requests_total{model="a",route="instance/gpu-a",status="200"} 2001.0' in (
        metrics
    )
    assert 'status="499"} 200.0' in metrics
