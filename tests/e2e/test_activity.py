"""The activity log and captures through a real gateway: every request has its row, naming the
swap it waited for; captured bodies come back byte for byte, and no secret reaches the disk."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.processes import Gateway, Sim, chat, gateway, instance, simulator
from tests.e2e.test_keys import entry

pytestmark = pytest.mark.e2e
TOKEN = "activity-admin-token"
VIEWER = "activity-viewer-token"
MAIN_KEY = "sk-main-secret-4711"
LIMITED_KEY = "sk-limited-secret-0815"
ENV = {"TEST_ADMIN_TOKEN": TOKEN, "TEST_VIEWER_TOKEN": VIEWER, "TEST_RELAY_KEY": "relay-key"}


def _config(node: Sim, relay: Sim, database: Path, **extra: Any) -> dict[str, Any]:
    return {
        "server": {"admin_token_env": "TEST_ADMIN_TOKEN"},
        "routing": {"poll_interval": "200ms", "min_residency": 0},
        "keepalive": {"early_headers_after": "30s"},
        "instances": [instance("gpu", node, capacity=1)],
        "relays": {"cloud": {"url": f"{relay.url}/v1", "api_key_env": "TEST_RELAY_KEY"}},
        "models": {"b": {"relay": "cloud", "relay_model": "remote-b", "fallback": "swap"}},
        "auth": {
            "viewer_token_env": "TEST_VIEWER_TOKEN",
            "keys": [entry("main", MAIN_KEY), entry("limited", LIMITED_KEY, rpm=1)],
        },
        "activity": {"path": str(database)},
        **extra,
    }


def _rows(gw: Gateway, **filters: Any) -> list[dict[str, Any]]:
    with gw.admin(VIEWER) as admin:
        page = admin.get("/admin/activity", params=filters)
    assert page.status_code == 200, page.text
    rows: list[dict[str, Any]] = page.json()["rows"]
    return rows


def _finished_swaps(gw: Gateway) -> list[dict[str, Any]]:
    """The swap log as the dashboard's first event gives it."""
    with (
        gw.admin(TOKEN) as admin,
        admin.stream("GET", "/admin/events") as events,
    ):
        lines = events.iter_lines()
        assert next(lines) == "event: snapshot"
        state = json.loads(next(lines).removeprefix("data: "))
    swaps: list[dict[str, Any]] = state["swaps"]["recent"]
    return swaps


@pytest.fixture(scope="module")
def relay() -> Any:
    with simulator("openai", models=("remote-b",), api_key="relay-key") as sim:
        yield sim


def test_ten_waiters_name_one_swap_a_relayed_request_and_a_429_have_their_rows(
    relay: Sim, tmp_path: Path
) -> None:
    with (
        simulator(models=("a", "b"), load_time=1.5) as node,
        gateway(_config(node, relay, tmp_path / "activity.sqlite3"), ENV) as gw,
    ):
        auth = {"authorization": f"Bearer {MAIN_KEY}"}
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: chat(gw.url, "a", headers=auth), range(10)))
        assert [a.status_code for a in answers] == [200] * 10
        relayed = chat(gw.url, "b", headers=auth)  # a is warm at capacity 1: b swaps in
        assert relayed.headers["x-swapgate-route"] == "relay/cloud"
        limited = {"authorization": f"Bearer {LIMITED_KEY}"}
        assert chat(gw.url, "a", headers=limited).status_code in (200, 503)
        refused = chat(gw.url, "a", headers=limited)
        assert refused.status_code == 429

        rows = {row["request_id"]: row for row in _rows(gw, model="a", key="main")}
        waited = [rows[a.headers["x-request-id"]] for a in answers]
        assert {row["placement"] for row in waited} == {"swap"}
        assert {row["instance"] for row in waited} == {"gpu"}
        swap_ids = {row["swap_id"] for row in waited}
        assert len(swap_ids) == 1, "the ten waited for one swap"
        first_load = min(s["id"] for s in _finished_swaps(gw) if s["model"] == "a")
        assert swap_ids == {first_load}, "a's first load: the limited key's request loads it again"
        assert all(row["wait_ms"] >= 1000 for row in waited), "they waited for the 1.5 s load"
        assert all(
            row["tokens_out"] == a.json()["usage"]["completion_tokens"]
            for row, a in zip(waited, answers, strict=True)
        )

        (relay_row,) = _rows(gw, model="b")
        assert relay_row["request_id"] == relayed.headers["x-request-id"]
        assert (relay_row["placement"], relay_row["instance"]) == ("relayed", "cloud")

        (refused_row,) = _rows(gw, key="limited", status=429)
        assert refused_row["request_id"] == refused.headers["x-request-id"]
        assert (refused_row["placement"], refused_row["instance"]) == ("refused", None)
        assert refused_row["error"] == "rate_limited"

        shown = gw.cli("activity", "--model", "a", "--limit", "3", token=VIEWER)
        assert shown.returncode == 0, shown.stderr
        assert f"#{swap_ids.pop()}" in shown.stdout
        assert "older: --before" in shown.stdout

        with gw.admin(VIEWER) as admin:
            counts = admin.get("/admin/activity/counts", params={"since": "1h"}).json()
        per = {(c["key"], c["model"]): 0 for c in counts["counts"]}
        for count in counts["counts"]:
            per[count["key"], count["model"]] += count["requests"]
        assert per[("main", "a")] == 10
        assert per[("limited", "a")] == 2


COOKIE = "session=cookie-secret-9002"
SECRET_HEADERS = {
    "authorization": f"Bearer {MAIN_KEY}",
    "x-api-key": MAIN_KEY,
    "api-key": "azure-secret-5150",  # Azure OpenAI's header
    "x-goog-api-key": "gemini-secret-6160",  # Gemini's
    "cookie": COOKIE,
}


def _send(gw: Gateway, model: str, *, stream: bool = False) -> tuple[bytes, httpx.Response]:
    """A request whose body is exact bytes (non-ASCII text kept as UTF-8), with every kind of
    secret header a client sends; its answer read whole."""
    message = {"role": "user", "content": f"héllo ✓ {model}"}
    body = json.dumps(
        {"model": model, "messages": [message], "max_tokens": 5, "stream": stream},
        ensure_ascii=False,
    ).encode()
    headers = {**SECRET_HEADERS, "content-type": "application/json"}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", content=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    return body, answer


def _capture(gw: Gateway, answer: httpx.Response, token: str = TOKEN) -> httpx.Response:
    with gw.admin(token) as admin:
        return admin.get(f"/admin/captures/{answer.headers['x-request-id']}")


def test_a_captured_models_bodies_come_back_byte_for_byte_and_no_secret_is_stored(
    relay: Sim, tmp_path: Path, umask_022: None
) -> None:
    database = tmp_path / "state" / "activity.sqlite3"  # its folder is the gateway's to make
    with simulator(models=("a", "b"), load_time=0.2) as node:
        config = _config(node, relay, database, capture={"models": ["a"]})
        config["instances"][0]["capacity"] = 2
        with gateway(config, ENV) as gw:
            sent, answer = _send(gw, "a")
            streamed_sent, streamed = _send(gw, "a", stream=True)
            _, other = _send(gw, "b")
            captured = _capture(gw, answer)
            assert captured.status_code == 200, captured.text
            kept = captured.json()
            assert kept["request"]["body"].encode() == sent
            assert kept["response"]["body"].encode() == answer.content
            assert not kept["request"]["truncated"]
            names = {name.lower() for name, _ in kept["request"]["headers"]}
            assert "content-type" in names
            assert not names & set(SECRET_HEADERS)
            again = _capture(gw, streamed).json()
            assert again["request"]["body"].encode() == streamed_sent
            assert again["response"]["body"].encode() == streamed.content
            assert b"data: [DONE]" in streamed.content
            assert _capture(gw, other).status_code == 404, "b is not captured"
            assert _capture(gw, answer, VIEWER).status_code == 403, "bodies: the operator's"

            gw.rewrite_config({**config, "capture": {"models": ["b"]}})
            with gw.admin(TOKEN) as admin:
                assert admin.post("/admin/reload").status_code == 200
            _, now_b = _send(gw, "b")
            _, now_a = _send(gw, "a")
            assert _capture(gw, now_b).status_code == 200, "turned on by a reload"
            assert _capture(gw, now_a).status_code == 404, "and off"
    with sqlite3.connect(database) as db:  # the gateway has stopped: its WAL is folded in
        assert db.execute("SELECT COUNT(*) FROM captures").fetchone()[0] == 3
    files = list(database.parent.glob("activity.sqlite3*"))
    stored = b"".join(p.read_bytes() for p in files)
    for secret in (MAIN_KEY, "cookie-secret-9002", "azure-secret-5150", "gemini-secret-6160"):
        assert secret.encode() not in stored
    assert TOKEN.encode() not in stored
    # Whole prompts and answers at rest: private whatever the umask (022 here)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}
    assert stat.S_IMODE(database.parent.stat().st_mode) == 0o700


def test_two_gateways_on_one_host_with_default_settings_keep_their_own_rows(relay: Sim) -> None:
    """Same state folder, no activity.path: each gateway's own file, named by its port."""
    with simulator(models=("a", "b"), load_time=0.1) as node:
        ours, theirs = _config(node, relay, Path()), _config(node, relay, Path())
        del ours["activity"], theirs["activity"]
        with gateway(ours, ENV) as first, gateway(theirs, ENV) as second:
            for gw, model in ((first, "a"), (second, "b")):
                assert chat(
                    gw.url, model, headers={"authorization": f"Bearer {MAIN_KEY}"}
                ).is_success
            seen = {gw.url: {row["model"] for row in _rows(gw)} for gw in (first, second)}
    assert seen == {first.url: {"a"}, second.url: {"b"}}


@contextlib.contextmanager
def small_disk(where: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at ``where``: a disk that can be filled."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a small disk needs mount (root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Write to ``disk`` until it is full."""
    with (disk / "filler").open("ab", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 4096)


def test_a_full_disk_drops_rows_counted_says_so_once_and_every_request_is_answered(
    relay: Sim, tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    auth = {"authorization": f"Bearer {MAIN_KEY}"}
    with (
        small_disk(tmp_path / "disk") as disk,
        simulator(models=("a", "b"), load_time=0.1, ttft=0) as node,
        gateway(_config(node, relay, disk / "activity.sqlite3"), ENV, log=log) as gw,
    ):
        assert chat(gw.url, "a", headers=auth).status_code == 200
        assert len(_rows(gw)) == 1, "written while there was room"
        fill(disk)
        answers = []
        for _ in range(40):  # each drain (every 0.25 s) is a transaction of WAL pages
            answers.append(chat(gw.url, "a", headers=auth).status_code)
            time.sleep(0.03)
        with gw.admin(VIEWER) as admin:
            dropped = admin.get("/admin/activity").json()["dropped"]
    said = log.read_text()
    assert answers == [200] * 40, "the disk never fails a request"
    assert dropped > 0, "the rows it refused are counted"
    assert said.count("rows cannot be written") == 1, said
    assert "Traceback" not in said
