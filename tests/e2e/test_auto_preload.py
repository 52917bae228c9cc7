"""``preloads: - {model, auto: true}`` (issue 23): warmed before its learned peak, and the
learning kept across restarts."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from bench.redis import redis_server
from swapgate.control.loops.forecast import FILE, SLOT, SLOTS, WEEKENDS
from swapgate.control.loops.forecast import kind as kind_of
from tests.e2e.processes import gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "admin-secret"


def test_an_auto_job_warms_its_model_for_the_learned_peak_and_keeps_what_it_learns(
    tmp_path: Path,
) -> None:
    if SLOT - time.time() % SLOT < 15:  # the peak written below begins in the slot under way
        time.sleep(SLOT - time.time() % SLOT + 1)
    now = time.time()
    slot = int(now % 86400 // SLOT)
    usual = [0.2] * SLOTS
    usual[slot] = usual[(slot + 1) % SLOTS] = 12.0  # three days of a's peak, beginning now
    a = {"usual": usual, "days": 3, "weekend": usual, "weekend_days": 3, "today": [0] * SLOTS}
    history = {"day": int(now // 86400), "models": {"a": a}}
    (tmp_path / FILE).write_text(json.dumps(history))
    env = {"SWAPGATE_STATE_DIR": str(tmp_path), "TEST_ADMIN_TOKEN": TOKEN}
    with simulator(models=("a", "b"), load_time=0.3) as sim:
        config = {
            "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
            "routing": {"poll_interval": "200ms"},
            "instances": [instance("gpu", sim)],
            "preloads": [{"model": "a", "auto": True}],
        }
        with gateway(config, env) as gw:
            wait_for(lambda: sim.stats()["loads"].get("a") == 1, timeout=10)
            jobs = gw.cli("jobs", token=TOKEN)
            for model in ("b", "b", "b"):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                assert httpx.post(f"{gw.url}/v1/chat/completions", json=body).status_code == 200
    assert jobs.returncode == 0, jobs.stderr
    start = datetime.fromtimestamp(now - now % SLOT, UTC).strftime("%H:%M")
    kind = "weekends" if kind_of(now) == WEEKENDS else "weekdays"
    assert f"at {start} UTC on {kind} (learned over 3 days)" in jobs.stdout, jobs.stdout
    saved = json.loads((tmp_path / FILE).read_text())["models"]
    assert sum(saved["b"]["today"]) == 3  # written at shutdown: b's arrivals are not lost
    assert saved["a"]["usual"][slot] == 12.0


def test_among_replicas_the_learned_day_is_everyones_and_lives_in_redis() -> None:
    """Two replicas on one Redis: the one that leads folds yesterday's shared counts into the
    usual day kept there and warms a's peak; both replicas' arrivals reach the shared counts."""
    if SLOT - time.time() % SLOT < 15:
        time.sleep(SLOT - time.time() % SLOT + 1)
    now = time.time()
    today, slot = int(now // 86400), int(now % 86400 // SLOT)
    usual = [0.2] * SLOTS
    usual[slot] = 12.0
    with redis_server() as server, simulator(models=("a", "b"), load_time=0.3) as sim:
        shared = redis.Redis.from_url(server.url, decode_responses=True)
        shared.hset(f"swapgate:demand:{today - 1}", mapping={f"a:{slot}": 7, "b:3": 1})
        a = {"usual": usual, "days": 2, "weekend": usual, "weekend_days": 2}
        shared.set("swapgate:demand", json.dumps({"day": today - 1, "models": {"a": a}}))
        config = {
            "routing": {"poll_interval": "200ms"},
            "instances": [instance("gpu", sim)],
            "preloads": [{"model": "a", "auto": True}],
        }
        env = {"SWAPGATE_REDIS_URL": server.url, "SWAPGATE_ADMIN_TOKEN": TOKEN}
        with (
            gateway(config, {**env, "SWAPGATE_CLUSTER__REPLICA_ID": "r1"}) as one,
            gateway(config, {**env, "SWAPGATE_CLUSTER__REPLICA_ID": "r2"}) as two,
        ):
            wait_for(lambda: sim.stats()["loads"].get("a") == 1, timeout=10)
            for gw, count in ((one, 2), (two, 3)):
                for _ in range(count):
                    body = {"model": "b", "messages": [{"role": "user", "content": "hi"}]}
                    answer = httpx.post(f"{gw.url}/v1/chat/completions", json=body, timeout=10)
                    assert answer.status_code == 200
            jobs = [gw.cli("jobs", token=TOKEN).stdout for gw in (one, two)]
        learned = json.loads(shared.get("swapgate:demand") or "{}")
        counted = shared.hgetall(f"swapgate:demand:{today}")
    assert all("(learned over 3 days)" in out for out in jobs), jobs  # yesterday folded in
    assert learned["day"] == today
    weekend = kind_of(now - 86400) == WEEKENDS  # yesterday's counts go to its kind of day
    usual_of, days_of = ("weekend", "weekend_days") if weekend else ("usual", "days")
    assert learned["models"]["a"][usual_of][slot] == pytest.approx(0.7 * 12 + 0.3 * 7)
    assert learned["models"]["a"][days_of] == 3
    assert learned["models"]["b"][days_of] == 1
    assert int(counted[f"b:{slot}"]) == 5  # both replicas' arrivals, the last at shutdown
