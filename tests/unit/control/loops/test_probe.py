"""The decay probe in-process: one streamed prompt to each warm model that falls back to a relay
and one to the relay, side by side, under a lease that starts no swap (the HTTP side is httpx's
mock transport; the real loop against a gateway is in tests/e2e/test_decay.py)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from swapgate.control.loops.decay import DecayWatch
from swapgate.control.loops.probe import Prober
from swapgate.data.warm import WarmState
from tests.unit.fakes import World, world

RELAY_URL = "https://relay.example/v1"


def probed(monkeypatch: pytest.MonkeyPatch) -> World:
    """x serves a (relayed to cloud as cloud-a) and b (relayed nowhere)."""
    monkeypatch.setenv("PROBE_RELAY_KEY", "k")
    return world(
        {
            "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
            "relays": {
                "cloud": {
                    "url": RELAY_URL,
                    "probe_interval": "5m",
                    "api_key_env": "PROBE_RELAY_KEY",
                }
            },
            "models": {"a": {"relay": "cloud", "relay_model": "cloud-a"}},
            "routing": {"min_residency": 0},
        }
    )


class Upstreams:
    """Answers each probe with a stream whose first line is a token, or with ``failing``'s
    status for the hosts named there; keeps what each host was asked."""

    def __init__(self, failing: dict[str, int] | None = None) -> None:
        self.failing = failing or {}
        self.asked: list[tuple[str, str, str, str | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        auth = request.headers.get("authorization")
        self.asked.append((request.url.host, request.url.path, body["model"], auth))
        assert (body["max_tokens"], body["stream"]) == (1, True)
        status = self.failing.get(request.url.host)
        if status is not None:
            return httpx.Response(status, json={"error": "down"})
        chunk = {"choices": [{"delta": {"content": "OK"}}]}
        return httpx.Response(200, text=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")


def prober(w: World, upstreams: Upstreams) -> Prober:
    decay = DecayWatch(w.settings.diagnosis, time.monotonic)
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstreams))
    return Prober(w.settings, w.router, decay, w.metrics, client)


async def test_a_warm_model_and_its_relay_are_probed_side_by_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = probed(monkeypatch)
    w.warm("x", "a", "b")
    upstreams = Upstreams()
    probe = prober(w, upstreams)
    assert probe.wanted
    await probe.round("cloud")
    assert sorted(upstreams.asked) == [
        ("relay.example", "/v1/chat/completions", "cloud-a", "Bearer k"),
        ("x", "/v1/chat/completions", "a", None),
    ], "b falls back to no relay: not probed"
    for target in ("instance/x", "relay/cloud"):
        assert w.sample("swapgate_probe_requests_total", target=target, result="ok") == 1
        assert w.sample("swapgate_probe_ttft_seconds_count", target=target) == 1
    assert w.registry.snapshot().instance("x").inflight == 0, "the probe's lease went back"
    counted = [s for m in w.metrics.registry.collect() for s in m.samples]
    assert not [s for s in counted if s.name == "swapgate_requests_total"], "not a client's"


async def test_a_cold_model_is_not_swapped_in_for_a_probe_and_its_relay_still_is_probed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = probed(monkeypatch)
    w.warm("x", "b")
    upstreams = Upstreams()
    await prober(w, upstreams).round("cloud")
    assert [host for host, *_ in upstreams.asked] == ["relay.example"]
    assert w.drivers["x"].calls == []
    assert w.state("x", "a") is WarmState.COLD


async def test_a_failed_probe_is_counted_as_an_error_and_gives_its_lease_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = probed(monkeypatch)
    w.warm("x", "a")
    await prober(w, Upstreams(failing={"x": 503})).round("cloud")
    assert w.sample("swapgate_probe_requests_total", target="instance/x", result="error") == 1
    assert w.sample("swapgate_probe_ttft_seconds_count", target="instance/x") is None
    assert w.sample("swapgate_probe_requests_total", target="relay/cloud", result="ok") == 1
    assert w.registry.snapshot().instance("x").inflight == 0
