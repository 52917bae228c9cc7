from __future__ import annotations

from pathlib import Path

import pytest

from swapgate.cli import main


def test_check_config_accepts_a_valid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("instances:\n  - {name: gpu-a, url: 'http://10.0.0.5:8000'}\n")
    assert main(["check-config", str(path)]) == 0
    assert "OK (1 instances: gpu-a)" in capsys.readouterr().out


def test_check_config_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("instances:\n  - {name: gpu-a, url: nope, weight: -1}\n")
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "instances[0].url: not a URL: 'nope'" in err
    assert "instances[0].weight:" in err


def test_serve_without_a_config_says_how_to_give_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SWAPGATE_CONFIG", raising=False)
    assert main(["serve"]) == 1
    assert "--config" in capsys.readouterr().err


def test_serve_with_a_redis_url_that_is_not_one_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("instances:\n  - {name: gpu-a, url: 'http://10.0.0.5:8000'}\n")
    monkeypatch.setenv("SWAPGATE_REDIS_URL", "localhost:6379")
    assert main(["serve", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "$SWAPGATE_REDIS_URL is not a Redis URL" in err
    assert "redis://host:6379/0" in err
