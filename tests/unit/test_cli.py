from __future__ import annotations

from pathlib import Path

import pytest

from swapgate.tools.cli import main


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


def test_check_config_gives_the_rule_for_a_proxy_in_front_and_warns_past_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "slow.yaml"
    path.write_text(
        "instances:\n  - {name: gpu-a, url: 'http://10.0.0.5:8000'}\n"
        "keepalive: {interval: 90s}\n"
        "models:\n  big: {keepalive: {early_headers_after: 45s}}\n"
    )
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nginx proxy_read_timeout 60s" in out
    assert "Cloudflare 100s" in out
    assert "warning: keepalive.interval 90s is not well under the 60s read timeout" in out
    assert "warning: models.big.keepalive.early_headers_after 45s" in out
    default = tmp_path / "default.yaml"
    default.write_text("instances:\n  - {name: gpu-a, url: 'http://10.0.0.5:8000'}\n")
    assert main(["check-config", str(default)]) == 0
    assert "warning" not in capsys.readouterr().out  # 1 s and 5 s: well under every front


@pytest.mark.parametrize(
    "argv",
    [
        ["preload", "m", "--pin-for", "10 hours"],
        ["sim", "--load-time", "5x"],
        ["sim", "--grow-rss", "lots"],
        ["sim", "--load-times", "a=2,b"],
    ],
)
def test_a_bad_value_is_refused_with_the_usage_line_before_anything_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"swapgate {argv[0]}: error: argument {argv[-2]}" in err, err
