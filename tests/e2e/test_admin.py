"""Preloads, pins, the admin API, hot reload and the admin CLI against a live gateway."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.e2e.processes import Gateway, Sim, chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "admin-secret"
ENV = {"TEST_ADMIN_TOKEN": TOKEN}


def _config(*instances: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"poll_interval": "200ms", "min_residency": 0, "max_wait": "10s"},
        "keepalive": {"early_headers_after": "30s"},
        "instances": list(instances),
        **extra,
    }


def _cli(gw: Gateway, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    return gw.cli(*args, token=token)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Gateway, Sim, Sim]]:
    with (
        simulator(models=("p", "x", "y"), load_time=0.5) as one,
        simulator(models=("p", "x", "y"), load_time=0.5) as two,
    ):
        preloads = [
            {"name": "new-year", "model": "x", "cron": "0 7 1 1 *", "timezone": "Asia/Tokyo"},
            {
                "name": "morning",
                "model": "p",
                "cron": "0 6 * * 1-5",
                "instances": 1,
                "pin_for": "1h",
                "timezone": "Europe/Berlin",
            },
        ]
        config = _config(instance("gpu-a", one), instance("gpu-b", two), preloads=preloads)
        with gateway(config, ENV) as gw:
            yield gw, one, two


def test_admin_needs_the_token(pair) -> None:
    gw, _, _ = pair
    for token in (None, "wrong"):
        with gw.admin(token) as admin:
            response = admin.get("/admin/state")
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_without_a_configured_token_admin_is_404() -> None:
    with (
        simulator(models=("a",)) as sim,
        gateway(_config(instance("gpu-a", sim))) as gw,
        gw.admin(TOKEN) as admin,
    ):
        assert admin.get("/admin/state").status_code == 404
        assert admin.post("/admin/reload").status_code == 404


def test_jobs_list_the_next_run_in_their_time_zone(pair) -> None:
    gw, _, _ = pair
    with gw.admin(TOKEN) as admin:
        jobs = {job["name"]: job for job in admin.get("/admin/jobs").json()["jobs"]}
    tokyo = datetime.now(ZoneInfo("Asia/Tokyo"))
    expected = datetime(tokyo.year + 1, 1, 1, 7, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert jobs["new-year"]["next_run"] == expected.isoformat()
    assert jobs["new-year"]["last_run"] is None
    assert jobs["morning"]["next_run"].endswith(("+01:00", "+02:00"))


def test_running_a_job_leaves_the_model_warm_and_pinned(pair) -> None:
    gw, one, two = pair
    with gw.admin(TOKEN) as admin:
        result = admin.post("/admin/jobs/morning/run").json()
        assert result["ok"] is True
        (where,) = result["instances"]
        sim = one if where == "gpu-a" else two
        assert sim.stats()["resident"] == {"p": "ready"}
        state = admin.get("/admin/state").json()
        held = next(i for i in state["instances"] if i["name"] == where)["models"]["p"]
        assert held["state"] == "warm"
        assert held["pinned_until"] is not None
        job = next(j for j in admin.get("/admin/jobs").json()["jobs"] if j["name"] == "morning")
        assert job["last_result"]["ok"] is True
    assert 'swapgate_preload_runs_total{job="morning",result="ok"} 1.0' in gw.metrics()


def test_a_pinned_model_survives_a_burst_for_other_models(pair) -> None:
    gw, one, _ = pair
    with gw.admin(TOKEN) as admin:
        pinned = admin.post(
            "/admin/preload", json={"model": "p", "instance": "gpu-a", "pin_for": "1h"}
        ).json()
        assert pinned["instances"] == ["gpu-a"]
        admin.post("/admin/unload", json={"model": "p", "instance": "gpu-b"})
        loads_before = dict(one.stats()["loads"])
        answers = [chat(gw.url, model, max_tokens=2) for model in ["x", "y"] * 4]
        assert [a.status_code for a in answers] == [200] * 8
        assert {a.headers["x-swapgate-route"] for a in answers} == {"instance/gpu-b"}
        assert one.stats()["resident"] == {"p": "ready"}
        assert one.stats()["loads"] == loads_before, "gpu-a did not swap at all"


def test_a_lone_pinned_instance_makes_other_models_wait_not_evict() -> None:
    with simulator(models=("p", "x"), load_time=0.2) as sim:
        config = _config(instance("gpu-a", sim), models={"x": {"max_wait": "1s"}})
        with gateway(config, ENV) as gw, gw.admin(TOKEN) as admin:
            admin.post("/admin/preload", json={"model": "p", "pin_for": "1h"}).raise_for_status()
            response = chat(gw.url, "x", max_tokens=2)
            assert response.status_code == 503
            assert "max_wait" in response.json()["error"]["message"]
            assert sim.stats()["resident"] == {"p": "ready"}


def test_a_preload_that_does_not_wait_answers_202(pair) -> None:
    gw, _, two = pair
    with gw.admin(TOKEN) as admin:
        admin.post("/admin/unload", json={"model": "x"}).raise_for_status()
        started = admin.post("/admin/preload?wait=false", json={"model": "x", "instance": "gpu-b"})
        assert started.status_code == 202
        assert started.json() == {"status": "started", "model": "x"}
        wait_for(lambda: two.stats()["resident"] == {"x": "ready"}, timeout=5)


def test_drained_instances_take_no_new_requests(pair) -> None:
    gw, _, _ = pair
    with gw.admin(TOKEN) as admin:
        assert admin.post("/admin/instances/gpu-a/drain").json()["drained"] is True
        try:
            routes = {
                chat(gw.url, model, max_tokens=2).headers["x-swapgate-route"] for model in "pxy"
            }
            assert routes == {"instance/gpu-b"}
        finally:
            admin.post("/admin/instances/gpu-a/undrain").raise_for_status()
        assert admin.post("/admin/instances/nope/drain").status_code == 404


def test_reload_keeps_warm_models_warm_and_refuses_broken_files() -> None:
    with simulator(models=("a", "b"), load_time=0.5) as sim:
        config = _config(instance("gpu-a", sim))
        with gateway(config, ENV) as gw, gw.admin(TOKEN) as admin:
            assert chat(gw.url, "a", max_tokens=2).status_code == 200
            gw.rewrite_config({**config, "models": {"a": {"aliases": ["alpha"]}}})
            assert admin.post("/admin/reload").json()["status"] == "reloaded"
            again = chat(gw.url, "alpha", max_tokens=2)
            assert again.status_code == 200
            assert again.headers["x-swapgate-wait-ms"] == "0"
            assert sim.loads() == 1, "no new swap on the backend"

            gw.rewrite_config({**config, "routing": {"max_wait": "soon"}, "instances": []})
            refused = admin.post("/admin/reload")
            assert refused.status_code == 400
            problems = refused.json()["error"]["problems"]
            assert any(p.startswith("routing.max_wait: not a duration") for p in problems)
            assert chat(gw.url, "alpha", max_tokens=2).status_code == 200, (
                "the running config stayed"
            )

            gw.rewrite_config({**config, "models": {"a": {"aliases": ["first"]}}})
            gw.process.send_signal(signal.SIGHUP)
            wait_for(lambda: chat(gw.url, "first", max_tokens=2).status_code == 200)
            assert sim.loads() == 1


def test_the_cli_shows_and_steers_a_live_gateway(pair) -> None:
    gw, _, _ = pair
    preload = _cli(gw, "preload", "y", "--instance", "gpu-b", "--pin-for", "30m")
    assert preload.returncode == 0, preload.stderr
    assert "y is warm on gpu-b, pinned for 30m" in preload.stdout

    status = _cli(gw, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].split() == [
        "INSTANCE",
        "MODEL",
        "STATE",
        "PINNED",
        "UNTIL",
        "IN-FLIGHT",
        "QUEUE",
        "ETA",
        "WEIGHTS",
        "IN",
        "RAM",
        "ENGINE",
    ]
    row = next(line.split() for line in lines if line.startswith("gpu-b") and " y " in line)
    assert row[2] == "warm"
    assert row[3].endswith("Z")
    assert row[7] == "-", "no weight files known"
    assert " ".join(row[8:]) == "healthy (TTFT baseline not ready)", "its diagnosis"

    jobs = _cli(gw, "jobs")
    assert "new-year" in jobs.stdout
    assert "Asia/Tokyo" in jobs.stdout

    unload = _cli(gw, "unload", "y", "--instance", "gpu-b")
    assert unload.stdout.strip() == "unloaded y from gpu-b"


def test_the_cli_says_what_is_wrong(pair) -> None:
    gw, _, _ = pair
    refused = _cli(gw, "status", token="wrong")
    assert refused.returncode == 1
    assert "admin token was refused" in refused.stderr
    unknown = _cli(gw, "preload", "nope")
    assert unknown.returncode == 1
    assert "'nope' does not exist" in unknown.stderr
    gone = _cli(gw, "status", "--url", "http://127.0.0.1:9")
    assert gone.returncode == 1
    assert "cannot reach swapgate at http://127.0.0.1:9" in gone.stderr


def test_a_job_fires_by_itself() -> None:
    with simulator(models=("a", "b"), load_time=0.2) as sim:
        preloads = [{"name": "every-second", "model": "b", "cron": "* * * * * *"}]
        with gateway(_config(instance("gpu-a", sim), preloads=preloads), ENV) as gw:
            wait_for(lambda: sim.stats()["resident"] == {"b": "ready"}, timeout=5)
            wait_for(lambda: 'job="every-second",result="ok"' in gw.metrics(), timeout=5)


def test_after_a_reload_scheduled_preloads_place_by_the_new_policy() -> None:
    with simulator(models=("a", "b"), load_time=0.2) as sim:
        job = {"name": "warm-b", "model": "b", "cron": "0 7 1 1 *"}
        config = _config(instance("gpu-a", sim, capacity=1), preloads=[job])
        config["routing"] = {**config["routing"], "min_residency": "1h", "swap_timeout": "3s"}
        with gateway(config, ENV) as gw, gw.admin(TOKEN) as admin:
            assert chat(gw.url, "a", max_tokens=2).status_code == 200  # a is warm and was just used
            config["routing"] = {**config["routing"], "min_residency": 0}
            gw.rewrite_config(config)
            assert admin.post("/admin/reload").json()["status"] == "reloaded"
            run = admin.post("/admin/jobs/warm-b/run")
            resident = sim.stats()["resident"]
    # Under the old min_residency the job would wait out swap_timeout and fail, a untouchable.
    assert run.status_code == 200, run.text
    assert run.json()["instances"] == ["gpu-a"]
    assert resident == {"b": "ready"}  # a was evicted for it
