"""Is the decay local? (docs/operations.md) Under a flat load, the engine's diagnosis follows what
the simulator is made to do: a KV pool that grows (memory and TTFT rising together), a slowdown
with flat memory, and the relay slowing down too; ``recycle_rss_slope`` restarts a growing
engine long before an absolute ``recycle_rss`` would."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Gateway, gateway, metric_in, simulator, wait_for
from tests.e2e.test_process import ENV, TOKEN, process_config, processes, sim_command

pytestmark = pytest.mark.e2e
DIAGNOSIS = {"baseline": "3s", "window": "3s", "drift": 1.5, "memory_slope": "1GiB/h"}
BODY = {
    "model": "a",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 2,
    "stream": True,
}


@contextmanager
def flat_load(url: str, per_second: float = 10) -> Iterator[list[int]]:
    """Streamed requests at a steady rate, whatever their latency; their statuses."""
    statuses: list[int] = []
    stop = threading.Event()

    def one() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=BODY, timeout=60) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        ok = answer.status_code == 200 and events[-1:] == ["data: [DONE]"]
        statuses.append(answer.status_code if ok else 599)

    def pace(pool: concurrent.futures.ThreadPoolExecutor) -> None:
        while not stop.wait(1 / per_second):
            pool.submit(one)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        pacer = threading.Thread(target=pace, args=(pool,))
        pacer.start()
        try:
            yield statuses
        finally:
            stop.set()
            pacer.join()


def diagnosis(gw: Gateway) -> dict[str, Any]:
    state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {TOKEN}"})
    model = state.json()["instances"][0]["models"].get("a", {})
    return model.get("diagnosis") or {"state": "not warm"}


def watch_states(gw: Gateway, until: Callable[[dict[str, Any]], bool], timeout: float) -> list[str]:
    """The diagnoses seen, every 0.2 s, until ``until`` holds for one."""
    seen: list[str] = []
    current: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = diagnosis(gw)
        if not seen or seen[-1] != current["state"]:
            seen.append(current["state"])
        if until(current):
            return seen
        time.sleep(0.2)
    raise TimeoutError(f"not within {timeout}s; seen {seen}; last {current}")


def slow_ttft(baseline_ms: float | None) -> float:
    """A TTFT (seconds) well past ``drift`` times a baseline p95, which a loaded machine (a
    whole suite on two cores) can push to hundreds of milliseconds."""
    return max(1.0, 4 * (baseline_ms or 0) / 1000)


def test_a_growing_kv_pool_is_kv_growth_and_is_recycled_on_its_slope() -> None:
    command = {
        "cmd": sim_command("a", startup=0),
        "stop_timeout": "50ms",
        "recycle_rss": "4GiB",
        "recycle_rss_slope": "20GiB/h",
        "slope_window": "8s",
    }
    config = process_config(a=command)
    config["diagnosis"] = DIAGNOSIS
    with gateway(config, ENV) as gw, flat_load(gw.url) as statuses:
        # A drift is said once the baseline (its first 3 s) is over
        before = watch_states(gw, lambda d: d.get("ttft_drift_ratio") is not None, 15)
        first = processes(gw)["a"]
        # The engine starts to keep 4 MiB a request (40 MiB/s), and its TTFT grows with what it
        # keeps: 4 s per GiB, or faster where a loaded machine's baseline is already slow, so
        # the drift shows within seconds, before the slope's recycle
        per_gib = 4 * slow_ttft(diagnosis(gw)["ttft_baseline_p95_ms"])
        faults = {"grow_rss": 4 * 2**20, "ttft_per_gib": per_gib}
        httpx.post(f"http://127.0.0.1:{first['port']}/sim/faults", json=faults).raise_for_status()
        growing = watch_states(gw, lambda d: d["state"] == "kv-growth", 15)
        figures = diagnosis(gw)
        peak = [0.0]

        def recycled() -> bool:
            metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
            peak[0] = max(peak[0], metric_in(metrics, "swapgate_process_rss_bytes", model="a"))
            return metric_in(metrics, "swapgate_process_recycles_total", model="a") >= 1

        wait_for(recycled, timeout=30)
        second = processes(gw)["a"].get("pid")
        metrics = gw.metrics()
    print(f"kv-growth: {figures}; recycled with the group at most {peak[0] / 2**20:.0f} MiB")
    assert before[-1] == "healthy"
    assert growing[-1] == "kv-growth", growing
    assert figures["rss_slope_bytes_per_hour"] > 2**30
    assert figures["ttft_p95_ms"] > 1.5 * figures["ttft_baseline_p95_ms"]
    assert second not in (None, first["pid"]), "a new process serves"
    assert peak[0] < 2 * 2**30, "restarted on its slope, far below the absolute recycle_rss"
    assert set(statuses) == {200}, "no request was cut by the restart"
    assert "swapgate_probe_requests_total{" not in metrics, "no probe unless configured"
    assert 'swapgate_engine_diagnosis{instance="node",model="a",state="healthy"}' in metrics


def test_flat_memory_is_placement_or_preemption_and_a_relay_slowing_too_is_global() -> None:
    with simulator(flavor="openai", models=("a",), load_time=0) as relay:
        config = process_config(a=sim_command("a", startup=0))
        config["diagnosis"] = DIAGNOSIS
        config["relays"] = {"cloud": {"url": f"{relay.url}/v1", "probe_interval": "250ms"}}
        config["models"] = {"a": {"relay": "cloud", "fallback": "off"}}
        with gateway(config, ENV) as gw, flat_load(gw.url) as statuses:
            ready = ("relay_drift_ratio", "ttft_drift_ratio")  # both baselines are over
            wait_for(lambda: all(diagnosis(gw).get(k) is not None for k in ready), timeout=15)
            before = diagnosis(gw)
            assert before["state"] == "healthy", before
            engine = processes(gw)["a"]["port"]
            slow = {"ttft": slow_ttft(before["ttft_baseline_p95_ms"])}
            httpx.post(f"http://127.0.0.1:{engine}/sim/faults", json=slow).raise_for_status()
            local = watch_states(gw, lambda d: d["state"] != "healthy", 15)
            local_figures = diagnosis(gw)
            relay.faults(ttft=slow_ttft(local_figures["relay_ttft_p50_ms"]))
            both = watch_states(gw, lambda d: d["state"] == "global", 15)
            served = len(statuses)
            metrics = gw.metrics()
    print(f"placement-or-preemption: {local_figures}")
    assert local[-1] == "placement-or-preemption", local
    assert local_figures["rss_slope_bytes_per_hour"] is None or (
        abs(local_figures["rss_slope_bytes_per_hour"]) < 2**30
    )
    assert both[-1] == "global", both
    assert metric_in(metrics, "swapgate_engine_diagnosis", state="global") == 1
    assert metric_in(metrics, "swapgate_probe_requests_total", target="relay/cloud") >= 5
    assert metric_in(metrics, "swapgate_probe_requests_total", target="instance/node") >= 5
    assert metric_in(metrics, "swapgate_probe_ttft_seconds_count", target="relay/cloud") >= 5
    answered = metric_in(metrics, "swapgate_requests_total")
    assert served <= answered <= served + 32, "probes are not counted as clients' requests"
    assert metric_in(metrics, "swapgate_ttft_drift_ratio", model="a") >= 1.5


def test_a_leak_that_recycling_keeps_cutting_short_shows_its_slope_and_kv_growth() -> None:
    """An engine that keeps 4 MiB a request, no TTFT drift, the default 10-minute diagnosis
    window, polls every second and a 4 s slope_window: before its restart the engine shows its
    slope and ``kv-growth``, and the next load shows the slope it was restarted for."""
    command = {
        "cmd": sim_command("a", startup=0, flags="--grow-rss 4MiB"),
        "stop_timeout": "50ms",
        "recycle_rss_slope": "2GiB/h",
        "slope_window": "4s",
    }
    config = process_config(a=command)
    config["routing"]["poll_interval"] = "1s"
    seen: list[tuple[str, float, int | None]] = []  # (state, slope, pid) every 0.1 s

    def restarted() -> bool:
        found = diagnosis(gw)
        slope = found.get("rss_slope_bytes_per_hour") or 0.0
        seen.append((found["state"], slope, processes(gw).get("a", {}).get("pid")))
        return gw.metric("swapgate_process_recycles_total", model="a") >= 1

    with gateway(config, ENV) as gw, flat_load(gw.url) as statuses:
        wait_for(lambda: processes(gw).get("a", {}).get("pid") is not None, timeout=15)
        first = processes(gw)["a"]["pid"]
        wait_for(restarted, timeout=30, interval=0.1)
        wait_for(lambda: diagnosis(gw)["state"] != "not warm", timeout=15)
        after = diagnosis(gw)
        gauge = gw.metric("swapgate_process_rss_slope_bytes_per_hour", model="a")
    before = [(state, slope) for state, slope, pid in seen if pid == first]
    print(f"\nbefore the restart: {before[-3:]}; after: {after}")
    shown = [slope for state, slope in before if state == "kv-growth"]
    assert shown, f"kv-growth shown before the restart: {before}"
    assert max(shown) > 2 * 2**30, "with its slope, past recycle_rss_slope"
    assert after["state"] == "kv-growth", "the next load shows what it was restarted for"
    assert after["rss_slope_bytes_per_hour"] > 2 * 2**30
    assert gauge > 2 * 2**30, "and so does swapgate_process_rss_slope_bytes_per_hour"
    assert set(statuses) == {200}, "no request was cut by the restart"
