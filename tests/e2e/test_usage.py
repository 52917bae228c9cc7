"""Tokens per key (docs/keys.md, docs/operations.md "Activity"): a key's ``tpm`` held under
concurrent streams, ``/admin/usage`` and ``swapgate usage`` summing what the clients were told
they used, and ``swapgate_tokens_total`` counting the same."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import openai
import pytest

from tests.e2e.processes import Gateway, gateway, instance, simulator
from tests.e2e.test_keys import entry

pytestmark = pytest.mark.e2e
TOKEN = "usage-admin-token"
ENV = {"SWAPGATE_ADMIN_TOKEN": TOKEN}
TPM = 30
WAVE = 3  # streams at once


def stream(gw: Gateway, key: str, model: str) -> tuple[int, int] | int:
    """One streamed chat completion: its usage (prompt, completion) as the client read it, or
    the status it was refused with."""
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
    try:
        chunks = list(
            client.chat.completions.create(
                model=model,
                stream=True,
                max_tokens=5,
                messages=[{"role": "user", "content": "hello"}],
                stream_options={"include_usage": True},
            )
        )
    except openai.APIStatusError as refused:
        return refused.status_code
    finally:
        client.close()
    usage = chunks[-1].usage
    assert usage is not None, "the engine's usage, in the last chunk"
    return usage.prompt_tokens, usage.completion_tokens


def test_a_key_is_held_to_its_tpm_and_usage_sums_what_the_clients_were_told() -> None:
    with simulator(models=("a", "b"), load_time=0.1, ttft=0, capacity=2) as sim:
        config: dict[str, Any] = {
            "routing": {"min_residency": 0},
            "instances": [instance("gpu", sim, capacity=2)],
            "auth": {"keys": [entry("metered", "m-key", tpm=TPM), entry("free", "f-key")]},
        }
        with gateway(config, ENV) as gw, concurrent.futures.ThreadPoolExecutor(WAVE) as pool:
            waves = [
                list(pool.map(lambda _: stream(gw, "m-key", "a"), range(WAVE))) for _ in range(3)
            ]
            free = [stream(gw, "f-key", "b") for _ in range(2)]
            with gw.admin(TOKEN) as admin:
                by_key = admin.get("/admin/usage", params={"by": "key"}).json()
                by_model = admin.get("/admin/usage", params={"by": "model", "since": "1h"}).json()
            counted = {
                (key, kind): gw.metric("swapgate_tokens_total", key=key, model=model, kind=kind)
                for key, model in (("metered", "a"), ("free", "b"))
                for kind in ("prompt", "completion")
            }
    answered = [told for wave in waves for told in wave if isinstance(told, tuple)]
    refused = [told for wave in waves for told in wave if isinstance(told, int)]
    per_request = sum(answered[0])
    print(f"\nwaves: {waves}")
    # Admitted while under its tpm: a wave in flight may pass it, the next waits for the minute
    assert waves[0] == [answered[0]] * WAVE, "the first wave: well under the limit"
    assert sum(map(sum, answered)) >= TPM, "it reached its limit"
    assert sum(map(sum, answered)) < TPM + WAVE * per_request, "by at most one wave in flight"
    assert waves[-1] == [429] * WAVE, "then refused, until the minute moves on"
    assert set(refused) == {429}
    assert all(isinstance(told, tuple) for told in free), "another key is not held by it"

    sums = {row["key"]: row for row in by_key["rows"]}
    prompt = sum(p for p, _ in answered)
    completion = sum(c for _, c in answered)
    assert sums["metered"]["prompt_tokens"] == prompt
    assert sums["metered"]["completion_tokens"] == completion
    assert sums["metered"]["requests"] == len(answered) + len(refused)
    assert sums["free"]["total_tokens"] == sum(map(sum, free))  # type: ignore[arg-type]
    models = {row["model"]: row["total_tokens"] for row in by_model["rows"]}
    assert models == {"a": prompt + completion, "b": sums["free"]["total_tokens"]}
    assert counted[("metered", "prompt")] == prompt
    assert counted[("metered", "completion")] == completion
    assert (
        counted[("free", "prompt")] + counted[("free", "completion")]
        == sums["free"]["total_tokens"]
    )
