"""Two swapgate replicas on one real redis-server (docs/deploy.md), in front of two simulators.

Polls are an hour apart: whatever one replica learns from the other it learns from Redis.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from bench.redis import RedisServer, redis_server
from tests.e2e.nginx import nginx
from tests.e2e.processes import Gateway, Sim, chat, gateway, instance, simulator, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "cluster-admin"
HELLO = [{"role": "user", "content": "hi"}]


class Fleet:
    def __init__(self, replicas: list[Gateway], sims: list[Sim], redis: RedisServer) -> None:
        self.replicas, self.sims, self.redis = replicas, sims, redis

    def loads(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for sim in self.sims:
            for model, count in sim.stats()["loads"].items():
                total[model] = total.get(model, 0) + count
        return total

    def state(self, replica: int) -> dict[str, Any]:
        answer = httpx.get(
            f"{self.replicas[replica].url}/admin/state",
            headers={"authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        data: dict[str, Any] = answer.json()
        return data


@contextmanager
def fleet(load_time: float = 2.0, **config: Any) -> Iterator[Fleet]:
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server())
        sims = [
            stack.enter_context(simulator(models=("x", "y"), load_time=load_time)) for _ in range(2)
        ]
        settings = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"early_headers_after": "500ms", "interval": "1s"},
            "instances": [instance("gpu-1", sims[0]), instance("gpu-2", sims[1])],
            **config,
        }
        env = {"SWAPGATE_REDIS_URL": redis.url, "SWAPGATE_ADMIN_TOKEN": TOKEN}
        replicas = [
            stack.enter_context(gateway(settings, {**env, "SWAPGATE_CLUSTER__REPLICA_ID": name}))
            for name in ("r1", "r2")
        ]
        yield Fleet(replicas, sims, redis)


def test_20_requests_split_across_replicas_cause_one_swap_and_warm_models_stay() -> None:
    with fleet() as f, nginx({"pool": [r.url for r in f.replicas]}) as fronts:
        front = fronts["pool"]
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda _: chat(front, "x"), range(20)))
        assert [a.status_code for a in answers] == [200] * 20
        assert all("Hello from x" in a.text for a in answers)
        assert all(r.metric("swapgate_requests_total", status="200") > 0 for r in f.replicas), (
            "nginx split them across both replicas"
        )
        assert f.loads() == {"x": 1}, "one load for 20 requests on two replicas"
        assert (
            sum(r.metric("swapgate_swaps_total", model="x", result="ok") for r in f.replicas) == 1
        ), "and one swap: the other joined it"
        assert chat(front, "y").status_code == 200  # onto the other instance: a second swap
        for model in ("x", "y") * 10:
            assert chat(front, model).status_code == 200
        assert f.loads() == {"x": 1, "y": 1}, "warm on one instance each: no swap after"


def test_a_scheduled_preload_runs_once_per_trigger_on_one_replica() -> None:
    preload = {"name": "warm-y", "model": "y", "cron": "*/2 * * * * *", "instances": 1}

    def runs() -> list[int]:
        return [
            int(r.metric("swapgate_preload_runs_total", job="warm-y", result="ok"))
            for r in f.replicas
        ]

    with fleet(load_time=0.2, preloads=[preload]) as f:
        # counted from here: a busy machine starts the replicas slowly, with triggers meanwhile
        before, started = runs(), time.monotonic()
        time.sleep(7)  # three or four triggers
        after = runs()
        triggers = (time.monotonic() - started) / 2
        leaders = {f.state(i)["cluster"]["scheduler"] for i in range(2)}
        loads = f.loads()
    ran = [a - b for a, b in zip(after, before, strict=True)]
    assert sorted(after)[0] == 0, f"only one replica runs the schedule: {after}"
    # once per trigger (both replicas running it would double this)
    assert triggers - 1.5 <= sum(ran) <= triggers + 1, f"{ran} for {triggers:.1f} triggers"
    assert len(leaders) == 1
    assert leaders <= {"r1", "r2"}
    assert loads == {"y": 1}


def test_killing_the_replica_that_holds_a_swap_lock_leaves_one_swap_and_answers() -> None:
    with fleet(load_time=4.0) as f:
        holder, other = f.replicas
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            doomed = pool.submit(chat, holder.url, "x")
            wait_for(lambda: "gpu-1" in f.state(1)["cluster"]["swap_locks"])
            assert f.state(1)["cluster"]["swap_locks"]["gpu-1"]["replica"] == "r1"
            waiting = [pool.submit(chat, other.url, "x") for _ in range(5)]
            time.sleep(0.5)
            holder.process.kill()
            answers = [w.result() for w in waiting]
            with pytest.raises(httpx.HTTPError):
                doomed.result()
        assert [a.status_code for a in answers] == [200] * 5
        assert all("Hello from x" in a.text for a in answers)
        assert f.loads() == {"x": 1}, "no second swap of x on either instance"
        assert other.metric("swapgate_swaps_total", model="x", result="ok") <= 1, (
            "it drove the load at most once, after"
        )


def test_redis_killed_and_restarted_under_traffic_fails_no_request_and_state_converges() -> None:
    with fleet(load_time=0.5) as f:
        one = f.replicas[0]
        assert chat(one.url, "x").status_code == 200
        # Each phase lasts its seconds and at least four requests per replica, however loaded
        # the machine: Redis up, killed, started again.
        statuses: dict[str, list[int]] = {"up": [], "killed": [], "restarted": []}
        for phase, seconds in (("up", 1.0), ("killed", 2.0), ("restarted", 3.0)):
            if phase == "killed":
                f.redis.kill()
            elif phase == "restarted":
                f.redis.start()
            ends = time.monotonic() + seconds
            while time.monotonic() < ends or len(statuses[phase]) < 4 * len(f.replicas):
                for gw in f.replicas:
                    statuses[phase].append(chat(gw.url, "x", timeout=10).status_code)
        assert all(set(s) == {200} for s in statuses.values()), (
            f"no request fails because Redis did: {statuses}"
        )
        for gw in f.replicas:
            wait_for(lambda gw=gw: "swapgate_cluster_up 1.0" in gw.metrics(), timeout=10)
        with one.admin(TOKEN) as admin:
            assert admin.post("/admin/instances/gpu-2/drain").status_code == 200
        wait_for(lambda: _drained(f.state(1), "gpu-2"), timeout=5)
        replicas = {r["id"] for r in f.state(1)["cluster"]["replicas"]}
        assert replicas == {"r1", "r2"}
        assert f.loads() == {"x": 1}


def _drained(state: dict[str, Any], name: str) -> bool:
    return any(i["name"] == name and i["drained"] for i in state["instances"])
