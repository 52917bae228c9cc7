"""``swapgate check-config`` on the fleets of issue 63's bursts (tests/e2e/test_fleets.py): each
one passes and says what limits its instances, so the burst starts from a config the check
accepts; a pool that names no instance is refused, by its YAML path.

A model larger than every instance's memory is ``swapgate plan``'s to refuse (it exits 1 with a
warning: tests/unit/config/test_sizes.py); check-config accepts it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from swapgate.tools.cli import main


def fleet(
    instances: int, models: int, capacity: int, memory_gib: int | None = None
) -> dict[str, Any]:
    """A fleet shaped as the e2e burst's: llama-swap instances that each serve every model."""
    limits: dict[str, Any] = {"capacity": capacity}
    if memory_gib is not None:
        limits["memory"] = f"{memory_gib}GiB"
    config: dict[str, Any] = {
        "instances": [
            {"name": f"gpu-{i}", "kind": "llama-swap", "url": f"http://127.0.0.1:{9001 + i}"}
            | limits
            for i in range(instances)
        ]
    }
    if memory_gib is not None:  # 6, 10 and 14 GiB models, as the e2e memory fleet's
        config["models"] = {
            f"m{i:02d}": {"memory": f"{(6, 10, 14)[i % 3]}GiB"} for i in range(models)
        }
    return config


@pytest.mark.parametrize(
    ("config", "limited_by"),
    [
        (fleet(4, 32, 2), "capacity 2"),
        (fleet(8, 64, 2), "capacity 2"),
        (fleet(4, 16, 3, memory_gib=24), "capacity 3 and memory 24 GiB"),
    ],
    ids=["4x32-cap2", "8x64-cap2", "4x16-cap3-24GiB"],
)
def test_the_burst_fleets_pass_check_config(
    config: dict[str, Any],
    limited_by: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    count = len(config["instances"])
    assert f"OK ({count} instances: gpu-0, " in out
    for index in range(count):
        assert f"  gpu-{index}: resident models limited by {limited_by}\n" in out


def test_a_pool_that_names_no_instance_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = fleet(2, 4, 2)
    config["models"] = {"m00": {"pools": [{"name": "batch", "instances": ["gpu-9"]}]}}
    path = tmp_path / "fleet.yaml"
    path.write_text(json.dumps(config))
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "models.m00.pools[0].instances: no instance is named 'gpu-9'" in err
