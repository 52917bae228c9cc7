"""Keys with scopes and limits, and priority classes (docs/keys.md), through a real gateway in
front of simulators, and two replicas on a real redis-server."""

from __future__ import annotations

import concurrent.futures
import hashlib
import statistics
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.redis import redis_server
from tests.e2e.processes import chat, gateway, instance, simulator
from tests.e2e.wire import slow_link

pytestmark = pytest.mark.e2e
TOKEN = "admin-token"
ENV = {"SWAPGATE_ADMIN_TOKEN": TOKEN}


def entry(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), **fields}


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_a_scoped_key_sees_only_its_models_and_a_reloaded_keys_file_takes_effect(
    tmp_path: Path,
) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(yaml.safe_dump([entry("qwen-team", "q-key", models=["qwen-*"])]))
    config = {
        "routing": {"poll_interval": "200ms"},
        "instances": [{"name": "gpu", "url": "", "models": ["qwen-7b", "qwen-1b", "llama-70b"]}],
        "auth": {"keys_file": str(keys_file)},
    }
    with simulator(models=("qwen-7b", "qwen-1b", "llama-70b"), load_time=0.1) as sim:
        config["instances"][0]["url"] = sim.url  # type: ignore[index]
        with gateway(config, ENV) as gw, gw.admin(TOKEN) as admin:
            ok = chat(gw.url, "qwen-7b", headers=auth("q-key"))
            assert ok.status_code == 200, ok.text
            refused = [chat(gw.url, m, headers=auth("q-key")) for m in ("llama-70b", "no-such")]
            assert [r.status_code for r in refused] == [403, 403]
            errors = [r.json()["error"] for r in refused]
            assert {e["code"] for e in errors} == {"model_not_allowed"}
            assert errors[0]["message"].replace("llama-70b", "M") == errors[1]["message"].replace(
                "no-such", "M"
            ), "the same answer whether or not the model exists"
            listed = httpx.get(f"{gw.url}/v1/models", headers=auth("q-key"), timeout=5).json()
            assert sorted(m["id"] for m in listed["data"]) == ["qwen-1b", "qwen-7b"]
            unknown = chat(gw.url, "qwen-none", headers=auth("q-key"))
            assert unknown.status_code == 404
            assert "llama-70b" not in unknown.text, "a 404 names only models in its scope"
            assert chat(gw.url, "qwen-7b", headers=auth("new-key")).status_code == 401

            keys_file.write_text(yaml.safe_dump([entry("ops", "new-key", models=["*"])]))
            assert admin.post("/admin/reload").status_code == 200
            after = chat(gw.url, "llama-70b", headers=auth("new-key"))
            assert after.status_code == 200, after.text
            assert chat(gw.url, "qwen-7b", headers=auth("q-key")).status_code == 401, "removed"
            metrics = gw.metrics()
            state = admin.get("/admin/state").json()["keys"]
    assert 'swapgate_key_requests_total{key="qwen-team",status="403"} 2.0' in metrics
    assert 'swapgate_key_requests_total{key="ops",status="200"} 1.0' in metrics
    assert state["ops"]["last_minute"] == 1
    assert "sha256" not in state["ops"]


def slow_config(sims: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "routing": {"poll_interval": "1h", "min_residency": 0},
        "keepalive": {"non_streaming": "off"},
        "instances": [instance(f"gpu-{n}", sim) for n, sim in enumerate(sims)],
        "auth": {
            "keys": [
                entry("pair", "p-key", concurrency=2),
                entry("free", "f-key"),
                entry("three-a-minute", "m-key", rpm=3),
                entry("ten-tokens", "t-key", tpm=10),
                entry("one-at-a-time", "o-key", concurrency=1),
                entry("twice-a-minute-one-at-once", "w-key", rpm=2, concurrency=1),
            ]
        },
        **extra,
    }


def hold(url: str, key: str, seconds_of_tokens: int = 20) -> httpx.Response:
    """A request that stays in flight for about 2 s (20 tokens at 10 per second)."""
    return chat(url, "a", max_tokens=seconds_of_tokens, headers=auth(key))


def test_a_key_limited_to_2_at_once_gets_429_on_its_third_and_other_keys_do_not() -> None:
    with (
        simulator(models=("a",), load_time=0.1, token_rate=10) as sim,
        gateway(slow_config([sim])) as gw,
    ):
        assert chat(gw.url, "a", headers=auth("p-key")).status_code == 200  # warm
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = [pool.submit(hold, gw.url, "p-key") for _ in range(2)]
            time.sleep(0.5)
            third = chat(gw.url, "a", headers=auth("p-key"))
            other = pool.submit(chat, gw.url, "a", headers=auth("f-key"))
            assert [h.result().status_code for h in held] == [200, 200]
            assert other.result().status_code == 200, "another key is not limited"
        after = chat(gw.url, "a", headers=auth("p-key"))
        key_429 = gw.metric("swapgate_key_requests_total", key="pair", status="429")
    assert third.status_code == 429
    assert third.json()["error"]["code"] == "rate_limited"
    assert "'pair'" in third.json()["error"]["message"]
    assert third.headers["retry-after"] == "1"
    assert after.status_code == 200, "a slot came back when its requests ended"
    assert key_429 == 1


def test_across_two_replicas_on_redis_the_limit_holds_for_the_sum() -> None:
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server())
        sim = stack.enter_context(simulator(models=("a",), load_time=0.1, token_rate=10))
        env = {**ENV, "SWAPGATE_REDIS_URL": redis.url}
        replicas = [
            stack.enter_context(
                gateway(slow_config([sim]), {**env, "SWAPGATE_CLUSTER__REPLICA_ID": name})
            )
            for name in ("r1", "r2")
        ]
        one, two = (r.url for r in replicas)
        assert chat(one, "a").status_code == 401
        assert chat(one, "a", headers=auth("f-key")).status_code == 200  # warm
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = [pool.submit(hold, one, "p-key"), pool.submit(hold, two, "p-key")]
            time.sleep(0.6)
            thirds = [chat(url, "a", headers=auth("p-key")) for url in (one, two)]
            holding = key_use(one)
            assert [h.result().status_code for h in held] == [200, 200]
        again = [chat(url, "a", headers=auth("p-key")).status_code for url in (one, two)]
        per_minute = [chat(url, "a", headers=auth("m-key")) for url in (one, two, one, two)]
        # 1 + 3 tokens each: 4, 8, 12 counted in all when the fourth comes (each replica
        # alone has 8 at most, under 10)
        tokens = [chat(url, "a", headers=auth("t-key")) for url in (one, two, one, two)]
        counted = key_use(one)
        status = replicas[0].cli("status", token=TOKEN)
        redis.kill()
        without_redis = key_use(one)  # each replica's own use still; the cluster's unknown
    assert [t.status_code for t in thirds] == [429, 429], [t.text for t in thirds]
    # Each replica's own use, and the cluster's, as /admin/state tells them
    assert holding["here"]["pair"]["in_flight"] == 1
    assert holding["cluster"]["pair"] == {"in_flight": 2}
    assert counted["here"]["three-a-minute"]["last_minute"] == 2
    assert counted["cluster"]["three-a-minute"] == {"last_minute": 3}  # the 429 is not counted
    assert "free" not in counted["cluster"], "a key without limits is not counted in Redis"
    assert without_redis["cluster"] == {}
    assert without_redis["here"]["three-a-minute"]["last_minute"] == 2
    rows = {line.split()[0]: " ".join(line.split()) for line in status.stdout.splitlines() if line}
    assert rows["three-a-minute"] == "three-a-minute default (0) * 0 2 here, 3 in all of 3 never"
    assert again == [200, 200], "the slots came back on both replicas"
    assert [r.status_code for r in per_minute] == [200, 200, 200, 429], "3 a minute in all"
    assert "'three-a-minute' is at its limit of 3 requests per minute" in per_minute[3].text
    assert 1 <= int(per_minute[3].headers["retry-after"]) <= 60
    assert [t.json()["usage"]["total_tokens"] for t in tokens[:3]] == [4, 4, 4]
    assert [t.status_code for t in tokens] == [200, 200, 200, 429], "10 tokens a minute in all"
    assert "'ten-tokens' spent its 10 tokens per minute" in tokens[3].text


def key_use(url: str) -> dict[str, dict[str, Any]]:
    """The keys' use on the replica at ``url`` and across the cluster, from its /admin/state."""
    state = httpx.get(f"{url}/admin/state", headers=auth(TOKEN), timeout=10).json()
    return {"here": state["keys"], "cluster": state["cluster"]["keys"]}


# -- priority classes ----------------------------------------------------------------------

BATCH_REQUESTS, INTERACTIVE_REQUESTS = 20, 5
SWAP = 2.0  # the simulator's load time of either model


def contention(priorities: bool) -> tuple[list[float], list[int]]:
    """A batch key's 20 requests for ``bulk`` and, while they run, an interactive key's 5 for
    ``chat``, on one instance that holds one model: the interactive requests' waits (s), and
    every status."""
    keys = [
        entry("nightly", "b-key", **({"priority": "batch"} if priorities else {})),
        entry("chat-ui", "i-key", **({"priority": "interactive"} if priorities else {})),
    ]
    with simulator(models=("bulk", "chat"), load_time=SWAP, token_rate=20) as sim:
        config = {
            "routing": {"poll_interval": "1h", "min_residency": 0},
            "keepalive": {"non_streaming": "off"},
            "instances": [instance("gpu", sim)],
            "models": {"bulk": {"max_concurrency": 2}},
            "auth": {"keys": keys},
        }
        with gateway(config) as gw:
            assert chat(gw.url, "bulk", headers=auth("b-key")).status_code == 200  # warm
            statuses: list[int] = []
            waits: list[float] = []
            lock = threading.Lock()

            def ask(model: str, key: str, tokens: int) -> None:
                answer = chat(gw.url, model, max_tokens=tokens, headers=auth(key), timeout=120)
                with lock:
                    statuses.append(answer.status_code)
                    if key == "i-key":
                        waits.append(int(answer.headers["x-swapgate-wait-ms"]) / 1000)

            with concurrent.futures.ThreadPoolExecutor(
                BATCH_REQUESTS + INTERACTIVE_REQUESTS
            ) as pool:
                jobs = [pool.submit(ask, "bulk", "b-key", 10) for _ in range(BATCH_REQUESTS)]
                time.sleep(0.8)  # the batch is under way: 2 at a time, the rest queued
                jobs += [pool.submit(ask, "chat", "i-key", 3) for _ in range(INTERACTIVE_REQUESTS)]
                for job in jobs:
                    job.result()
    return waits, statuses


def test_interactive_requests_go_before_a_batch_on_the_same_instance() -> None:
    prioritised, statuses = contention(priorities=True)
    equal, equal_statuses = contention(priorities=False)
    assert statuses == [200] * (BATCH_REQUESTS + INTERACTIVE_REQUESTS), "every batch request too"
    assert equal_statuses == statuses
    p95 = statistics.quantiles(prioritised, n=20)[18]
    p95_equal = statistics.quantiles(equal, n=20)[18]
    print(f"interactive wait p95: {p95:.2f}s with classes, {p95_equal:.2f}s without")
    assert p95 < SWAP * 1.75, f"near one swap ({SWAP}s): {prioritised}"
    assert p95_equal > p95 + SWAP / 2, f"without classes they wait longer: {equal}"


def test_a_replica_far_from_redis_settles_a_key_before_the_answer_ends() -> None:
    # Each request to r1 reaches Redis 0.3 s late. An answer's tokens must be counted, and its
    # slot given back, before its end goes out, else the client's next request, to r2, sees the
    # key as it was: tokens it spent not counted, a slot still taken.
    with ExitStack() as stack:
        redis = stack.enter_context(redis_server())
        far = stack.enter_context(slow_link(redis.port, delay=0.3))
        sim = stack.enter_context(simulator(models=("a",), load_time=0.1, token_rate=10))
        replicas = [
            stack.enter_context(
                gateway(
                    slow_config([sim]),
                    {
                        **ENV,
                        "SWAPGATE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
                        "SWAPGATE_CLUSTER__REPLICA_ID": name,
                    },
                )
            )
            for name, port in (("r1", far), ("r2", redis.port))
        ]
        one, two = (r.url for r in replicas)
        assert chat(one, "a", headers=auth("f-key")).status_code == 200  # warm
        tokens = [chat(url, "a", headers=auth("t-key")) for url in (one, two, one, two)]
        in_turn = [chat(url, "a", headers=auth("o-key")) for url in (one, two, one, two)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(hold, two, "w-key")
            time.sleep(0.6)
            at_once = chat(one, "a", headers=auth("w-key"))
            assert held.result().status_code == 200
        twice = [chat(url, "a", headers=auth("w-key")) for url in (one, two)]
    assert [t.json()["usage"]["total_tokens"] for t in tokens[:3]] == [4, 4, 4]
    assert [t.status_code for t in tokens] == [200, 200, 200, 429], "10 tokens a minute in all"
    assert [r.status_code for r in in_turn] == [200] * 4, "one at a time, each after the last"
    assert at_once.status_code == 429
    assert "1 requests at once" in at_once.text
    # Refused for one limit, counted against none: the held request and one more make two
    assert [r.status_code for r in twice] == [200, 429]
    assert "2 requests per minute" in twice[1].text
