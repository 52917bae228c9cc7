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


def test_check_config_lists_the_keys_and_flags_an_expired_one_and_an_empty_scope() -> None:
    from datetime import date

    from swapgate.config.loading import parse_config
    from swapgate.tools.cli import keys_summary

    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    settings = parse_config(
        {
            "instances": [{"name": "gpu", "url": "http://127.0.0.1:9", "models": ["qwen-7b"]}],
            "auth": {
                "keys": [
                    {
                        "name": "chat",
                        "sha256": digest,
                        "models": ["qwen-*"],
                        "rpm": 60,
                        "concurrency": 4,
                    },
                    {"name": "old", "sha256": "0" * 64, "expires": "2026-01-31"},
                    {"name": "typo", "sha256": "1" * 64, "models": ["qwen7b"], "priority": "batch"},
                ]
            },
        }
    )
    lines = keys_summary(settings, today=date(2026, 12, 4))
    assert lines == [
        "  keys: 3",
        "    chat: models qwen-*; priority 0; 60 rpm; 4 at once",
        "    old: models *; priority 0; EXPIRED on 2026-01-31",
        "    typo: models qwen7b; priority -10; matches none of the models this config names",
    ]


def test_status_shows_each_engines_diagnosis_with_its_figures() -> None:
    from swapgate.tools.admin_cli import render_status

    diagnosis = {
        "state": "kv-growth",
        "ttft_drift_ratio": 3.39,
        "rss_slope_bytes_per_hour": 2150 * 2**20,
        "relay_drift_ratio": 1.03,
    }
    state = {
        "instances": [
            {
                "name": "node",
                "up": True,
                "drained": False,
                "swapping": None,
                "backoff_until": None,
                "serves": ["a"],
                "models": {"a": {"state": "warm", "inflight": 2, "diagnosis": diagnosis}},
            }
        ],
        "models": {"a": {"queue": 0, "eta_seconds": {"node": 3.0}}},
    }
    row = render_status(state).splitlines()[1]
    assert row.endswith("kv-growth (TTFT p95 3.4× baseline, memory +2150 MiB/h, relay 1.0×)")


def test_status_shows_a_backoff_on_the_model_it_belongs_to_not_its_instance() -> None:
    from swapgate.tools.admin_cli import render_status

    state = {
        "instances": [
            {
                "name": "gpu",
                "up": True,
                "drained": False,
                "swapping": None,
                "backoff_until": None,
                "serves": ["a", "b", "broken"],
                "models": {
                    "a": {"state": "warm", "inflight": 1},
                    "b": {
                        "state": "cold",
                        "inflight": 0,
                        "unreachable": "its vLLM server 127.0.0.1:8002 does not answer",
                    },
                    "broken": {
                        "state": "cold",
                        "inflight": 0,
                        "backoff_until": "2026-12-04T23:40:05Z",
                        "failure": "SIGSEGV",
                    },
                },
            }
        ],
        "models": {},
    }
    rows = {line.split()[1]: " ".join(line.split()) for line in render_status(state).splitlines()}
    assert rows["a"].startswith("gpu a warm -"), "the instance itself is not backing off"
    assert "cold (unreachable: its vLLM server 127.0.0.1:8002 does not answer)" in rows["b"]
    assert "cold (backing off until 2026-12-04T23:40:05Z: its load failed)" in rows["broken"]


def test_status_shows_each_keys_use_against_its_limits_here_and_in_all() -> None:
    from swapgate.tools.admin_cli import render_status

    keys = {
        "chat-ui": {
            "priority": 10,
            "models": ["qwen-*"],
            "rpm": 600,
            "concurrency": 4,
            "expires": None,
            "in_flight": 1,
            "last_minute": 12,
        },
        "nightly": {
            "priority": -10,
            "models": ["*"],
            "rpm": None,
            "concurrency": None,
            "expires": "2027-01-31T00:00:00+00:00",
            "in_flight": 3,
            "last_minute": 40,
        },
    }
    state = {
        "instances": [],
        "models": {},
        "keys": keys,
        "cluster": {
            "replica": "r1",
            "redis_up": True,
            "replicas": [],
            "swap_locks": {},
            "keys": {"chat-ui": {"in_flight": 3, "last_minute": 30}},
        },
    }
    lines = render_status(state).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("KEY"))
    chat, nightly = (" ".join(line.split()) for line in lines[start + 1 : start + 3])
    assert chat == (
        "chat-ui interactive (10) qwen-* 1 here, 3 in all of 4 12 here, 30 in all of 600 never"
    )
    assert nightly == "nightly batch (-10) * 3 40 2027-01-31T00:00:00+00:00"
    assert "KEY" not in render_status({**state, "keys": {}}), "no keys, no table"


def test_check_config_says_when_a_memory_slope_cannot_be_measured_at_the_poll_interval() -> None:
    from swapgate.config.loading import parse_config
    from swapgate.tools.cli import slope_advice

    def config(slope_window: str, poll: str) -> list[str]:
        command = {
            "cmd": "engine --port ${PORT}",
            "recycle_rss_slope": "1GiB/h",
            "slope_window": slope_window,
        }
        settings = parse_config(
            {
                "routing": {"poll_interval": poll},
                "diagnosis": {"window": "10m"},
                "instances": [{"name": "node", "kind": "process", "commands": {"m": command}}],
            }
        )
        return slope_advice(settings)

    assert config("20s", "5s") == []
    (warning,) = config("8s", "5s")
    assert warning.startswith(
        "warning: instances.node.commands.m.slope_window 8s cannot be measured at "
        "routing.poll_interval 5s"
    )
    assert "make it 10s or more" in warning
