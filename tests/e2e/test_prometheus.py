"""Metrics as an operator meets them: after a real swap, scraped by a real Prometheus."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from swapgate.drivers.children import die_with_parent
from tests.e2e.processes import (
    Gateway,
    Sim,
    free_port,
    gateway,
    instance,
    simulator,
    wait_for,
    wait_until_serving,
)

pytestmark = pytest.mark.e2e
LOAD = 1.0
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


@pytest.fixture(scope="module")
def swapped() -> Iterator[tuple[Gateway, Sim]]:
    """A gateway right after one swap of ``LOAD`` seconds and one answered request."""
    with simulator(models=("a", "b"), load_time=LOAD, token_rate=200) as sim:
        config = {"instances": [instance("gpu-a", sim)], "routing": {"poll_interval": "300ms"}}
        with gateway(config) as gw:
            body = {"model": "a", "messages": [], "max_tokens": 2}
            response = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=30)
            assert response.status_code == 200
            yield gw, sim


def _sample(text: str, name: str, labels: str) -> float:
    prefix = f"{name}{{{labels}}} "
    line = next(line for line in text.splitlines() if line.startswith(prefix))
    return float(line.removeprefix(prefix))


def test_one_swap_shows_in_metrics(swapped) -> None:
    gw, _ = swapped
    text = gw.metrics()
    labels = 'instance="gpu-a",model="a",result="ok"'
    tiered = labels + ',weights="unknown"'  # no weight files configured
    assert _sample(text, "swapgate_swap_duration_seconds_count", tiered) == 1
    assert _sample(text, "swapgate_swap_duration_seconds_sum", tiered) >= LOAD
    assert _sample(text, "swapgate_swaps_total", labels) == 1
    assert _sample(text, "swapgate_model_warm", 'instance="gpu-a",model="a"') == 1
    assert _sample(text, "swapgate_model_warm", 'instance="gpu-a",model="b"') == 0
    routed = 'model="a",route="instance/gpu-a",status="200"'
    assert _sample(text, "swapgate_requests_total", routed) == 1
    assert _sample(text, "swapgate_wait_seconds_count", 'model="a"') == 1
    assert _sample(text, "swapgate_wait_seconds_sum", 'model="a"') >= LOAD
    ttfb = _sample(
        text, "swapgate_time_to_first_byte_seconds_sum", 'model="a",route="instance/gpu-a"'
    )
    assert ttfb >= LOAD


def test_a_real_prometheus_scrapes_the_swap_durations(swapped, tmp_path) -> None:
    gw, _ = swapped
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    config["scrape_configs"][0]["static_configs"] = [{"targets": [gw.url.removeprefix("http://")]}]
    config["rule_files"] = [str(DEPLOY / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    with _prometheus(tmp_path / "prometheus.yml") as api:

        def series() -> list[dict[str, Any]]:
            query = {"query": "swapgate_swap_duration_seconds_count"}
            result: list[dict[str, Any]] = httpx.get(f"{api}/api/v1/query", params=query).json()[
                "data"
            ]["result"]
            return result

        wait_for(lambda: bool(series()), timeout=20, interval=0.5)
        (found,) = series()
        assert found["metric"]["instance"] == "gpu-a"
        assert found["metric"]["model"] == "a"
        assert found["metric"]["result"] == "ok"
        assert found["metric"]["job"] == "swapgate"
        assert float(found["value"][1]) == 1
        rules = httpx.get(f"{api}/api/v1/rules").json()["data"]["groups"][0]["rules"]
        assert {r["name"] for r in rules} >= {"SwapgateSlowSwaps", "SwapgateInstanceDown"}


class _prometheus:
    def __init__(self, config: Path) -> None:
        self._config = config
        self._data = tempfile.TemporaryDirectory()
        self.url = f"http://127.0.0.1:{free_port()}"

    def __enter__(self) -> str:
        self._process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self._config}",
                f"--storage.tsdb.path={self._data.name}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            preexec_fn=die_with_parent,
        )
        wait_until_serving(f"{self.url}/-/ready", self._process)
        # It listens before it is ready, and until then answers 503 in plain text to queries.
        wait_for(lambda: httpx.get(f"{self.url}/-/ready").status_code == 200, timeout=30)
        return self.url

    def __exit__(self, *_: object) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)
        self._data.cleanup()


@pytest.mark.parametrize(
    "args",
    [
        ["check", "rules", str(DEPLOY / "alerts.yml")],
        ["check", "config", str(DEPLOY / "prometheus.yml")],
    ],
)
def test_promtool_accepts_the_shipped_files(args: list[str]) -> None:
    result = subprocess.run([PROMTOOL, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_scraping_while_200_requests_are_in_flight_breaks_nothing() -> None:
    with simulator(models=("a",), load_time=0.1, token_rate=10) as sim:
        httpx.get(f"{sim.url}/upstream/a/health", timeout=5).raise_for_status()
        with gateway(
            {"instances": [instance("gpu-a", sim)], "server": {"access_log": False}}
        ) as gw:
            answers, scrapes = asyncio.run(_load_and_scrape(gw.url, requests=200))
    assert [status for status, _ in answers] == [200] * 200
    # Every stream ran to its end. One whose first byte came after early_headers_after (1 s, on
    # a loaded machine) ends with a comment after it: ": swapgate waited N ms".
    assert all(_events(text)[-1] == "data: [DONE]" for _, text in answers)
    assert all(status == 200 for status, _ in scrapes)
    peak = max(
        _sample(text, "swapgate_inflight_requests", 'instance="gpu-a"') for _, text in scrapes
    )
    assert peak == 200, "the scrapes saw every request in flight"


def _events(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("data: ")]


async def _load_and_scrape(
    url: str, requests: int
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    limits = httpx.Limits(max_connections=requests + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def ask() -> tuple[int, str]:
            body = {"model": "a", "messages": [], "stream": True, "max_tokens": 20}
            response = await client.post("/v1/chat/completions", json=body)
            return response.status_code, response.text.strip()

        async def scrape() -> list[tuple[int, str]]:
            results = []
            for _ in range(20):
                await asyncio.sleep(0.05)
                response = await client.get("/metrics")
                results.append((response.status_code, response.text))
            return results

        load = asyncio.gather(*(ask() for _ in range(requests)))
        scrapes = await scrape()
        return list(await load), scrapes
