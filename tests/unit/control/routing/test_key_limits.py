"""Client keys (docs/keys.md): who a key is, what it may use, its class, and its limits."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import date
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swapgate.config.loading import load_config, parse_config
from swapgate.config.settings import ConfigError, KeyConfig
from swapgate.control.routing.key_limits import ADMITTED, KeyLimits, Verdict
from swapgate.errors import BadRequest, ModelNotAllowed, RateLimited, Unauthorized
from swapgate.proxy.auth import ClientAuth
from tests.unit.fakes import FakeClock

INSTANCES = [{"name": "gpu", "url": "http://127.0.0.1:9"}]


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


def key(name: str, secret: str, **fields: object) -> KeyConfig:
    return KeyConfig.model_validate({"name": name, "sha256": digest(secret), **fields})


def test_a_key_is_known_by_its_hash_and_a_plain_key_is_unscoped() -> None:
    auth = ClientAuth(["plain-one"], [key("chat-ui", "s3cret", models=["qwen-*"])])
    caller = auth.check(bearer("s3cret"))
    assert caller.name == "chat-ui"
    plain = auth.check([(b"x-api-key", b"plain-one")])
    assert (plain.name, plain.key) == ("SWAPGATE_API_KEYS", None)
    assert auth.allows(plain, "llama-70b")
    for wrong in (bearer("s3cre"), bearer("other"), []):
        with pytest.raises(Unauthorized):
            auth.check(wrong)


def test_no_keys_configured_lets_anyone_in() -> None:
    auth = ClientAuth([])
    assert not auth.on
    assert auth.check([]).name is None


def test_a_scope_of_globs_refuses_other_models_the_same_way_whether_or_not_they_exist() -> None:
    auth = ClientAuth([], [key("team", "k", models=["qwen-*", "llama-chat"])])
    caller = auth.check(bearer("k"))
    assert auth.allows(caller, "qwen-7b")
    assert auth.allows(caller, "llama-chat")
    assert not auth.allows(caller, "llama-70b")
    assert not auth.allows(caller, "qwen")
    messages = []
    for model in ("llama-70b", "no-such-model"):
        with pytest.raises(ModelNotAllowed) as refused:
            auth.check_model(caller, model)
        assert refused.value.status == 403
        assert refused.value.code == "model_not_allowed"
        messages.append(refused.value.message.replace(model, "MODEL"))
    assert messages[0] == messages[1]
    assert "qwen-*, llama-chat" in messages[0]
    auth.check_model(caller, "chat", "qwen-7b")  # an alias of a model in scope


def test_an_expired_key_is_refused_from_the_day_after_its_date() -> None:
    clock = FakeClock(1_782_777_600.0)  # 2026-06-30 00:00 UTC
    auth = ClientAuth([], [key("old", "k", expires="2026-06-30")], clock=clock)
    assert auth.check(bearer("k")).name == "old"
    clock.advance(86_399)
    assert auth.check(bearer("k")).name == "old"
    clock.advance(1)
    with pytest.raises(Unauthorized, match="'old' expired on 2026-06-30"):
        auth.check(bearer("k"))


def test_a_request_may_lower_its_class_and_raise_it_only_where_its_key_allows() -> None:
    auth = ClientAuth(
        [], [key("batch", "b", priority="batch"), key("ops", "o", priority_header=True)]
    )
    batch, ops = auth.check(bearer("b")), auth.check(bearer("o"))

    def asked(value: str) -> list[tuple[bytes, bytes]]:
        return [(b"x-swapgate-priority", value.encode())]

    assert auth.priority(batch, []) == -10
    assert auth.priority(batch, asked("interactive")) == -10, "not raised past its key"
    assert auth.priority(batch, asked("-50")) == -50, "lowered"
    assert auth.priority(ops, asked("interactive")) == 10
    assert auth.priority(ops, []) == 0
    with pytest.raises(BadRequest, match="interactive, default, batch or an integer"):
        auth.priority(ops, asked("urgent"))


def test_keys_come_from_the_config_and_a_keys_file_beside_it(tmp_path: Path) -> None:
    (tmp_path / "keys.yaml").write_text(
        f"keys:\n  - name: nightly\n    sha256: {digest('n').upper()}\n    priority: batch\n"
    )
    (tmp_path / "config.yaml").write_text(
        "instances: [{name: gpu, url: 'http://127.0.0.1:9'}]\n"
        f"auth: {{keys_file: keys.yaml, keys: [{{name: chat, sha256: '{digest('c')}'}}]}}\n"
    )
    settings = load_config(tmp_path / "config.yaml")
    assert [(k.name, k.priority) for k in settings.auth.keys] == [("chat", 0), ("nightly", -10)]
    assert settings.auth.keys[1].sha256 == digest("n"), "kept in lower case"
    (tmp_path / "keys.yaml").write_text(f"- name: chat\n  sha256: {digest('c')}\n  rpm: 0\n")
    with pytest.raises(ConfigError) as bad:
        load_config(tmp_path / "config.yaml")
    problems = "\n".join(bad.value.problems)
    assert "rpm: Input should be greater than or equal to 1" in problems
    (tmp_path / "keys.yaml").write_text(f"- name: chat\n  sha256: {digest('c')}\n")
    with pytest.raises(ConfigError, match="duplicate key name 'chat'"):
        load_config(tmp_path / "config.yaml")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "k", "sha256": "abc"}, "auth.keys[0].sha256"),
        ({"name": "k", "sha256": digest("k"), "priority": "urgent"}, "not a priority"),
        ({"name": "k", "sha256": digest("k"), "models": []}, "auth.keys[0].models"),
        ({"name": "k", "sha256": digest("k"), "secret": "k"}, "unknown key"),
    ],
)
def test_a_bad_key_entry_says_where_and_what(entry: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as bad:
        parse_config({"instances": INSTANCES, "auth": {"keys": [entry]}})
    assert problem in "\n".join(bad.value.problems)


def test_a_missing_keys_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"auth.keys_file: .*cannot read the file"):
        parse_config({"instances": INSTANCES, "auth": {"keys_file": "none.yaml"}}, tmp_path)


def test_requests_per_minute_are_counted_over_a_sliding_minute() -> None:
    clock = FakeClock()
    limits = KeyLimits(clock)
    limited = key("k", "k", rpm=3)

    async def run() -> None:
        for _ in range(3):
            await limits.release(await limits.admit(limited))
            clock.advance(10)
        with pytest.raises(RateLimited) as refused:
            await limits.admit(limited)
        assert refused.value.status == 429
        assert refused.value.code == "rate_limited"
        assert "'k'" in refused.value.message
        assert "3 requests per minute" in refused.value.message
        assert refused.value.retry_after == 30, "the first of the three leaves the minute then"
        clock.advance(30)
        await limits.admit(limited)
        assert limits.describe()["k"] == {
            "in_flight": 1,
            "last_minute": 3,
            "tokens_last_minute": 0,
        }

    asyncio.run(run())


def test_tokens_per_minute_admit_while_under_and_wait_for_the_minute_to_move_on() -> None:
    clock = FakeClock()
    limits = KeyLimits(clock)
    limited = key("t", "t", tpm=100)

    async def run() -> None:
        # Two at once, each admitted under the limit: together they pass it (tokens are known
        # once an answer is over)
        first, second = await limits.admit(limited), await limits.admit(limited)
        await limits.release(first, 60)
        clock.advance(20)
        await limits.release(second, 70)
        with pytest.raises(RateLimited) as refused:
            await limits.admit(limited)
        assert "spent its 100 tokens per minute" in refused.value.message
        assert refused.value.retry_after == 40, "the first 60 leave the minute then: 70 < 100"
        assert limits.describe()["t"]["tokens_last_minute"] == 130
        clock.advance(40)
        await limits.release(await limits.admit(limited), 0)  # no usage said: nothing counted
        assert limits.describe()["t"]["tokens_last_minute"] == 70
        # A key without a tpm counts no tokens
        free = key("free", "f")
        await limits.release(await limits.admit(free), 10_000)
        assert limits.describe()["free"]["tokens_last_minute"] == 0

    asyncio.run(run())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 60)), max_size=60))
def test_the_limits_read_exactly_the_last_minute(steps: list[tuple[int, int]]) -> None:
    # Against a model that keeps everything and sums it: requests that each spend ``tokens``,
    # ``gap`` whole seconds apart (so that one leaves the minute exactly as another comes),
    # under rpm 5 and tpm 150.
    clock = FakeClock()
    limits = KeyLimits(clock)
    limited = key("k", "k", rpm=5, tpm=150)
    arrivals: list[float] = []
    spent: list[tuple[float, int]] = []

    async def run() -> None:
        for gap, tokens in steps:
            clock.advance(gap)
            now = clock()
            recent = [t for t in arrivals if t > now - 60]
            recent_tokens = sum(n for t, n in spent if t > now - 60)
            try:
                admitted = await limits.admit(limited)
            except RateLimited:
                assert len(recent) >= 5 or recent_tokens >= 150
                continue
            assert len(recent) < 5
            assert recent_tokens < 150
            arrivals.append(now)
            await limits.release(admitted, tokens)
            if tokens:
                spent.append((now, tokens))
            assert limits.describe()["k"]["tokens_last_minute"] == recent_tokens + tokens

    asyncio.run(run())


def test_a_key_with_a_high_rpm_keeps_one_minute_of_arrivals() -> None:
    clock = FakeClock()
    limits = KeyLimits(clock)
    busy = key("busy", "b", rpm=10_000_000, tpm=10_000_000_000)

    async def run() -> None:
        for _ in range(3_000):  # 10 a second for five minutes
            await limits.release(await limits.admit(busy), 7)
            clock.advance(0.1)

    asyncio.run(run())
    use = limits._use["busy"]  # its memory: what a long-lived gateway would keep
    assert len(use.arrivals) <= 601
    assert len(use.spent) <= 601
    assert limits.describe()["busy"]["tokens_last_minute"] == 7 * len(use.spent)


def test_a_request_settles_before_its_end_only_where_its_release_changes_the_next() -> None:
    limits = KeyLimits(FakeClock())

    async def run() -> list[bool]:
        keys = [
            key("rated", "r", rpm=5),  # counted as it arrives: nothing to settle
            key("free", "f"),
            key("tokens", "t", tpm=100),
            key("slots", "s", concurrency=2),
        ]
        return [(await limits.admit(k)).settles_at_end for k in keys]

    assert asyncio.run(run()) == [False, False, True, True]


def test_concurrent_requests_are_capped_and_a_slot_comes_back_when_one_ends() -> None:
    limits = KeyLimits(FakeClock())
    limited = key("pair", "p", concurrency=2)

    async def run() -> None:
        first, _ = await limits.admit(limited), await limits.admit(limited)
        with pytest.raises(RateLimited, match="'pair' is at its limit of 2 requests at once"):
            await limits.admit(limited)
        await limits.admit(key("other", "o", concurrency=2))  # another key is not affected
        await limits.release(first)
        await limits.admit(limited)

    asyncio.run(run())


def test_expiry_accepts_a_date() -> None:
    assert key("k", "k", expires=date(2027, 6, 30)).expires == date(2027, 6, 30)


class SlowRedis:
    """The cluster's counts, each settle one slow round trip."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, int, bool]] = []

    async def admit(
        self, name: str, rpm: int | None, tpm: int | None, concurrency: int | None
    ) -> Verdict | None:
        return ADMITTED

    async def settle(self, name: str, tokens: int, slot: bool) -> None:
        await asyncio.sleep(0.05)
        self.settled.append((name, tokens, slot))


def test_a_release_cancelled_on_its_way_still_gives_the_cluster_its_slot_back() -> None:
    redis = SlowRedis()
    limits = KeyLimits(FakeClock(), redis)
    limited = key("pair", "p", concurrency=2, tpm=100)

    async def run() -> None:
        admitted = await limits.admit(limited)
        releasing = asyncio.create_task(limits.release(admitted, 30))
        await asyncio.sleep(0.01)
        releasing.cancel()  # its client went away as its answer ended
        with pytest.raises(asyncio.CancelledError):
            await releasing
        await asyncio.sleep(0.1)

    asyncio.run(run())
    assert redis.settled == [("pair", 30, True)]
    assert limits.describe()["pair"]["in_flight"] == 0
