"""``swapgate sim --ports``: one simulator per port in one process, each with its own state."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import httpx
import pytest

from swapgate.sim.app import create_sim_fleet
from swapgate.sim.backend import SimConfig
from swapgate.tools.arguments import port_list
from swapgate.tools.cli import main


async def test_each_port_keeps_its_own_models() -> None:
    configs = [SimConfig(port=port, models=("a", "b"), load_time=0.0) for port in (9101, 9102)]
    transport = httpx.ASGITransport(create_sim_fleet(configs))
    async with httpx.AsyncClient(transport=transport) as client:
        loaded = await client.get("http://127.0.0.1:9101/upstream/a/health")
        first = (await client.get("http://127.0.0.1:9101/running")).json()
        second = (await client.get("http://127.0.0.1:9102/running")).json()
        stray = await client.get("http://127.0.0.1:9103/running")
    assert loaded.status_code == 200
    assert first == {"running": [{"model": "a", "state": "ready"}]}
    assert second == {"running": []}
    assert stray.status_code == 404


def test_port_list_reads_ports_in_order() -> None:
    assert port_list("9002, 9001,") == (9002, 9001)
    assert port_list("") == ()


@pytest.mark.parametrize("text", ["0", "65536", "90a", "9001,9001", "-1"])
def test_port_list_refuses_what_is_no_port(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        port_list(text)


def test_the_ports_flag_runs_one_simulator_per_port(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[str, Sequence[int]]] = []

    def fleet(config: SimConfig, ports: Sequence[int]) -> None:
        started.append((config.flavor, ports))

    monkeypatch.setattr("swapgate.sim.run_sim_fleet", fleet)
    assert main(["sim", "--flavor", "openai", "--ports", "9001,9002"]) == 0
    assert started == [("openai", (9001, 9002))]


def test_the_keep_alive_flag_sets_how_long_idle_connections_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[SimConfig] = []
    monkeypatch.setattr("swapgate.sim.run_sim", started.append)
    assert main(["sim", "--keep-alive", "5m"]) == 0
    assert main(["sim"]) == 0
    assert [config.keep_alive for config in started] == [300.0, 5.0]
