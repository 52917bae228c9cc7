"""Model sizes (docs/memory.md) and ``swapgate plan``: the arithmetic, its validation, its
advice."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swapgate.config.loading import parse_config
from swapgate.config.settings import ConfigError
from swapgate.config.sizes import Size, SizeConfig, human, size_of
from swapgate.tools.cli import main
from swapgate.tools.plan import as_json, make_plan, render

G, K = 2**30, 2**10
# Llama-3.3-70B in bf16: 80 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes
LLAMA_70B = {
    "weights": "141GB",
    "kv_per_token": 80 * 8 * 128 * 2 * 2,
    "context": 32768,
    "max_seqs": 32,
}
TP4 = {"name": "tp4", "url": "http://10.0.0.5:8000", "memory": "192GiB", "models": ["llama-70b"]}


def test_the_70b_arithmetic_per_token_per_sequence_and_at_max_seqs() -> None:
    size = size_of(SizeConfig.model_validate(LLAMA_70B))
    assert size is not None
    assert (size.kv_per_token, human(size.kv_per_token)) == (320 * K, "320 KiB")
    assert (size.kv_per_seq, human(size.kv_per_seq)) == (10 * G, "10 GiB")
    assert size.kv_per_seq / 1e9 == pytest.approx(10.7, abs=0.05)  # 10.7 GB
    assert size.kv == 320 * G
    assert size.total == round((141 * 10**9 + 320 * G) * 1.1)


@pytest.mark.parametrize(
    ("conf", "total"),
    [
        ({"memory": "40GiB"}, 40 * G),
        ({"weights": "18GiB"}, round(18 * G * 1.1)),
        (
            {
                "weights": "18GiB",
                "kv_per_token": "192KiB",
                "context": 16384,
                "max_seqs": 8,
                "memory_overhead": 0,
            },
            18 * G + 24 * G,
        ),
        ({}, None),
    ],
)
def test_a_size_is_given_or_computed(conf: dict[str, object], total: int | None) -> None:
    size = size_of(SizeConfig.model_validate(conf))
    assert (size.total if size else None) == total


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"memory": "40GiB", "weights": "30GiB"}, "models.m: memory is the whole size"),
        ({"weights": "8GiB", "kv_per_token": "64KiB"}, "kv_per_token needs context"),
        ({"kv_per_token": "64KiB", "context": 8192}, "kv_per_token needs weights too"),
        ({"weights": "lots"}, "models.m.weights: not a size: 'lots'"),
        ({"kv_cache_dtype": "int3"}, "models.m.kv_cache_dtype: Input should be"),
        ({"gguf": "/nowhere/model.gguf"}, "models.m.gguf: cannot read /nowhere/model.gguf"),
    ],
)
def test_sizes_that_do_not_add_up_are_named_by_their_yaml_path(
    model: dict[str, object], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        json.dumps({"instances": [{"name": "x", "url": "http://x"}], "models": {"m": model}})
    )
    from swapgate.config.loading import load_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(path)


def test_plan_warns_about_the_70b_and_says_what_would_fit() -> None:
    settings = parse_config({"instances": [TP4], "models": {"llama-70b": LLAMA_70B}})
    plan = make_plan(settings)
    text = render(plan)
    assert "320 KiB" in text
    assert "10 GiB" in text
    (warning,) = plan.warnings
    assert "llama-70b" in warning
    assert "fits no instance that serves it (largest: tp4 192 GiB)" in warning
    assert "at context 32768 × max_seqs 32" in warning
    # (192 GiB / 1.1 - 141 GB) of KV: 4 sequences of 32k, or 32 of 4k
    assert "context (max-model-len, -c) 4096 at max_seqs 32" in warning
    assert "max_seqs (max-num-seqs, -np) 4 at context 32768" in warning
    fixed = {**LLAMA_70B, "context": 4096}
    assert (
        make_plan(parse_config({"instances": [TP4], "models": {"llama-70b": fixed}})).warnings == []
    )


def test_plan_packs_instances_and_names_models_without_a_size() -> None:
    card = {"name": "card", "url": "http://x", "memory": "24GiB", "capacity": 3}
    models = {
        "a": {"memory": "10GiB"},
        "b": {"memory": "10GiB"},
        "c": {"memory": "20GiB"},
        "unsized": {},
    }
    plan = as_json(make_plan(parse_config({"instances": [card], "models": models})))
    (inst,) = plan["instances"]
    assert inst["fits_at_once"] == ["a", "b"]
    assert inst["fits_alone"] == ["a", "b", "c"]
    assert plan["models"]["c"] == {**plan["models"]["c"], "total": 20 * G, "given": True}
    (warning,) = plan["warnings"]
    assert warning.startswith("unsized on card: no size given")


def test_the_plan_command_prints_a_table_or_json_and_exits_1_on_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"instances": [TP4], "models": {"llama-70b": LLAMA_70B}}))
    assert main(["plan", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "MODEL",
        "WEIGHTS",
        "KV/TOKEN",
        "CONTEXT",
        "KV/SEQUENCE",
        "SEQS",
        "KV",
        "TOTAL",
    ]
    assert "warning: llama-70b" in out
    assert main(["plan", "--json", str(path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["models"]["llama-70b"]["kv_per_sequence"] == 10 * G
    good = {**LLAMA_70B, "context": 4096}
    path.write_text(json.dumps({"instances": [TP4], "models": {"llama-70b": good}}))
    assert main(["plan", str(path)]) == 0


def test_human_sizes() -> None:
    assert [human(n) for n in (512, 320 * K, 10 * G, int(131.4 * G))] == [
        "512 B",
        "320 KiB",
        "10 GiB",
        "131.4 GiB",
    ]
    assert Size(1, given=5).total == 5
