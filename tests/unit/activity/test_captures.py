"""Request captures: bodies back byte for byte, secrets never on disk, bounded, switchable."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from swapgate.activity.captures import Captures
from swapgate.activity.log import ActivityLog
from swapgate.config.settings import CaptureConfig

WEEK = 7 * 24 * 3600.0
EVERYTHING = CaptureConfig(models=["llama"])


@pytest.fixture
async def log() -> AsyncIterator[ActivityLog]:
    activity = ActivityLog(None, max_rows=100, max_age=WEEK)
    activity.start()
    yield activity
    await activity.close()


def store(captures: Captures, request_id: str, request: bytes, response: bytes = b"{}") -> None:
    captures.store(
        request_id,
        model="llama",
        key="alice",
        request_headers=[(b"content-type", b"application/json")],
        request_body=request,
        status=200,
        response_headers=[("content-type", "application/json")],
        response_body=response,
    )


def database_files(folder: Path) -> list[bytes]:
    """The raw bytes of ``activity.db`` and of any ``-wal``/``-shm`` beside it, main file first."""
    return [p.read_bytes() for p in sorted(folder.glob("activity.db*"))]


def body(side: object) -> bytes:
    assert isinstance(side, dict)
    text = side["body"]
    return base64.b64decode(text) if side["base64"] else text.encode()


async def test_bodies_come_back_byte_for_byte(log: ActivityLog) -> None:
    captures = Captures(log, EVERYTHING)
    utf8 = '{"prompt": "héllo ✓"}'.encode()
    binary = b"\xff\xfe\x00\x80 not utf-8"
    store(captures, "r1", utf8, binary)
    log.flush()

    found = await captures.get("r1")

    assert found is not None
    assert (found["request_id"], found["model"], found["key"], found["status"]) == (
        "r1",
        "llama",
        "alice",
        200,
    )
    assert body(found["request"]) == utf8
    assert found["request"]["base64"] is False  # type: ignore[index]
    assert body(found["response"]) == binary
    assert found["request"]["headers"] == [["content-type", "application/json"]]  # type: ignore[index]


async def test_an_unknown_request_has_no_capture(log: ActivityLog) -> None:
    assert await Captures(log, EVERYTHING).get("nope") is None


async def test_secret_headers_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "activity.db"
    log = ActivityLog(path, max_rows=100, max_age=WEEK)
    captures = Captures(log, EVERYTHING)
    log.start()
    captures.store(
        "r1",
        model="llama",
        key="alice",
        request_headers=[
            (b"Authorization", b"Bearer sk-secret-123"),
            (b"X-Api-Key", b"sk-secret-456"),
            (b"Proxy-Authorization", b"Basic sk-secret-789"),
            (b"Cookie", b"session=sk-secret-abc"),
            (b"api-key", b"sk-secret-azure"),  # Azure OpenAI's
            (b"x-goog-api-key", b"sk-secret-gemini"),  # Gemini's
            (b"User-Agent", b"probe-visible-42"),
        ],
        request_body=b"{}",
        status=200,
        response_headers=[("Set-Cookie", "session=sk-secret-def")],
        response_body=b"{}",
    )
    log.flush()
    found = await captures.get("r1")
    await log.close()

    assert found is not None
    assert found["request"]["headers"] == [["User-Agent", "probe-visible-42"]]  # type: ignore[index]
    assert found["response"]["headers"] == []  # type: ignore[index]
    stored = database_files(tmp_path)  # the WAL too, if one is left
    assert b"probe-visible-42" in stored[0]  # headers are kept as plain text: the check can see
    assert all(b"sk-secret" not in content for content in stored)


async def test_bodies_are_cut_at_max_bytes(log: ActivityLog) -> None:
    captures = Captures(log, CaptureConfig(models=["llama"], max_bytes="1KiB"))
    store(captures, "r1", b"x" * 3000, b"short")
    log.flush()

    found = await captures.get("r1")

    assert found is not None
    assert body(found["request"]) == b"x" * 1024
    assert found["request"]["truncated"] is True  # type: ignore[index]
    assert found["request"]["size"] == 3000  # type: ignore[index]
    assert body(found["response"]) == b"short"
    assert found["response"]["truncated"] is False  # type: ignore[index]


async def test_only_the_newest_keep_captures_remain(log: ActivityLog) -> None:
    captures = Captures(log, CaptureConfig(models=["llama"], keep=3))
    for n in range(5):
        store(captures, f"r{n}", b"{}")
    log.flush()

    kept = [n for n in range(5) if await captures.get(f"r{n}") is not None]

    assert kept == [2, 3, 4]


@pytest.mark.parametrize(
    ("config", "model", "key", "wanted"),
    [
        (CaptureConfig(models=["llama"]), "llama", None, True),
        (CaptureConfig(models=["llama"]), "qwen", "alice", False),
        (CaptureConfig(keys=["alice"]), "qwen", "alice", True),
        (CaptureConfig(keys=["alice"]), "qwen", None, False),
        (CaptureConfig(), "llama", "alice", False),
        (None, "llama", "alice", False),
    ],
)
async def test_wants_by_model_or_key(
    log: ActivityLog, config: CaptureConfig | None, model: str, key: str | None, wanted: bool
) -> None:
    assert Captures(log, config).wants(model, key) is wanted


async def test_set_config_none_turns_capture_off_at_runtime(log: ActivityLog) -> None:
    captures = Captures(log)
    assert not captures.wants("llama", "alice")  # off unless configured

    captures.set_config(EVERYTHING)
    assert captures.wants("llama", "alice")
    store(captures, "on", b"{}")

    captures.set_config(None)
    assert not captures.wants("llama", "alice")
    store(captures, "off", b"{}")
    log.flush()

    assert await captures.get("on") is not None
    assert await captures.get("off") is None
