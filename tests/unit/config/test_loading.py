from __future__ import annotations

import re
from pathlib import Path

import pytest

from swapgate.config.loading import load_config, parse_config
from swapgate.config.settings import ConfigError, parse_duration, parse_size

MINIMAL = {"instances": [{"name": "gpu-a", "url": "http://127.0.0.1:8000/"}]}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        (7, 7.0),
        ("30", 30.0),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "s", "-1s", True, "1 day"])
def test_bad_durations_say_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("20GiB", 20 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), (4096, 4096)],
)
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "20 GiBs", True, "-1GiB"])
def test_bad_sizes_say_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"not a size.*512MiB"):
        parse_size(text)


def test_a_process_instance_takes_its_models_from_its_commands() -> None:
    settings = parse_config(
        {
            "instances": [
                {
                    "name": "node",
                    "kind": "process",
                    "start_port": 6000,
                    "commands": {
                        "a": "llama-server --port ${PORT}",
                        "b": {
                            "cmd": "vllm serve b --port ${PORT}",
                            "recycle_rss": "20GiB",
                            "ready": "/health",
                            "stop_timeout": "30s",
                        },
                    },
                }
            ]
        }
    )
    (node,) = settings.instances
    assert node.models == ["a", "b"]
    assert node.url == "http://127.0.0.1"
    assert node.commands["a"].cmd == "llama-server --port ${PORT}"
    assert node.commands["a"].ready == "/v1/models"
    assert (node.commands["b"].recycle_rss, node.commands["b"].stop_timeout) == (20 * 2**30, 30)


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ({"kind": "process"}, "kind: process needs commands"),
        (
            {"kind": "process", "commands": {"a": {"cmd": "x", "recycle_rss": "big"}}},
            "instances[0].commands.a.recycle_rss: not a size",
        ),
        (
            {"kind": "process", "commands": {"a": {"cmd": "x", "ready": "health"}}},
            "instances[0].commands.a.ready",
        ),
        ({"url": "http://127.0.0.1:1", "commands": {"a": "x"}}, "for kind: process only"),
    ],
)
def test_process_instances_say_what_is_wrong(instance: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({"instances": [{"name": "node", **instance}]})


def test_defaults_fill_every_key_but_instances() -> None:
    settings = parse_config(MINIMAL)
    assert settings.server.port == 8080
    assert settings.routing.max_wait == 120.0
    assert settings.keepalive.streaming == "comment"
    assert settings.instances[0].url == "http://127.0.0.1:8000"
    assert settings.instances[0].capacity == 1
    assert settings.model_settings("anything").relay_policy == "off"
    # idle client connections outlive nginx's (upstream keepalive_timeout, 60s by default)
    assert settings.server.idle_timeout > 60
    assert settings.routing.eviction == "lru"
    assert settings.routing.demand_horizon == 3.0


def test_every_problem_is_listed_by_its_yaml_path() -> None:
    with pytest.raises(ConfigError) as failure:
        parse_config(
            {
                "instances": [
                    {"name": "a", "url": "ftp://x"},
                    {"name": "b", "url": "http://x", "kind": "tgi", "capacity": 0},
                ],
                "routing": {"max_wait": "soon"},
                "keepalive": {"streaming": "loud"},
                "extra": 1,
            }
        )
    problems = "\n".join(failure.value.problems)
    assert "instances[0].url: not a URL" in problems
    assert "instances[1].kind:" in problems
    assert "instances[1].capacity:" in problems
    assert "routing.max_wait: not a duration" in problems
    assert "keepalive.streaming:" in problems
    assert "extra: unknown key" in problems
    assert len(failure.value.problems) == 6


def test_instances_are_required() -> None:
    with pytest.raises(ConfigError, match="instances: Field required"):
        parse_config({})


def test_cross_references_are_checked() -> None:
    data = {
        "instances": [
            {"name": "a", "url": "http://x"},
            {"name": "a", "url": "http://y"},
        ],
        "models": {
            "m": {"aliases": ["n"], "upstream_names": {"zz": "m:7b"}, "relay": "nope"},
            "n": {"fallback": "swap"},
        },
        "preloads": [{"name": "p", "model": "m", "cron": "61 * * * *", "instances": 5}],
    }
    with pytest.raises(ConfigError) as failure:
        parse_config(data)
    problems = failure.value.problems
    assert "instances[1].name: duplicate instance name 'a'" in problems
    assert "models.m.aliases: 'n' is already a model name" in problems
    assert "models.m.upstream_names.zz: no instance is named 'zz'" in problems
    assert "models.m.relay: no relay named 'nope' (relays: none defined)" in problems
    assert "models.n.fallback: 'swap' needs a relay; set models.n.relay" in problems
    assert any(p.startswith("preloads[0]: invalid cron") for p in problems)
    assert "preloads[0].instances: 5 instances asked for, only 2 configured" in problems


def test_auto_preloads_need_no_cron_and_no_name() -> None:
    one = [{"name": "a", "url": "http://x"}]
    settings = parse_config({"instances": one, "preloads": [{"model": "org/m", "auto": True}]})
    assert settings.preloads[0].name == "auto-org-m"
    assert settings.preloads[0].cron is None
    jobs = [
        {"model": "m", "auto": True, "cron": "0 8 * * *"},
        {"name": "p", "model": "m"},
        {"name": "auto-m", "model": "m", "cron": "0 8 * * *"},
    ]
    with pytest.raises(ConfigError) as failure:
        parse_config({"instances": one, "preloads": jobs})
    assert failure.value.problems == [
        "preloads[0]: auto learns when to preload; drop cron, or drop auto to keep the cron",
        "preloads[1].cron: missing; give a cron such as '0 8 * * 1-5', or auto: true",
        "preloads[2].name: duplicate job name 'auto-m'",
    ]


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "server:\n  port: 1234\n  host: 0.0.0.0\ninstances:\n  - {name: a, url: 'http://x'}\n"
    )
    monkeypatch.setenv("SWAPGATE_SERVER__PORT", "9000")
    monkeypatch.setenv("SWAPGATE_ROUTING__MAX_WAIT", "3m")
    settings = load_config(path)
    assert settings.server.port == 9000
    assert settings.server.host == "0.0.0.0"
    assert settings.routing.max_wait == 180.0


def test_a_bad_environment_value_names_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPGATE_SERVER__PORT", "eighty")
    with pytest.raises(ConfigError, match=r"server\.port:"):
        parse_config(MINIMAL)


@pytest.mark.parametrize(
    ("content", "message"),
    [("instances: [", "not valid YAML"), ("- 1\n- 2\n", "top level must be a mapping")],
)
def test_unreadable_files_say_why(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("name", ["config/demo.yaml", "config/example.yaml"])
def test_shipped_configs_are_valid(name: str) -> None:
    root = Path(__file__).resolve().parents[3]
    assert load_config(root / name).instances


def test_a_bare_yaml_off_means_off(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "instances: [{name: a, url: 'http://x'}]\n"
        "keepalive: {streaming: off, non_streaming: off}\n"
        "models: {m: {fallback: off, keepalive: {streaming: off}}}\n"
    )
    settings = load_config(path)
    assert settings.keepalive.streaming == "off"
    assert settings.keepalive.non_streaming == "off"
    assert settings.models["m"].relay_policy == "off"
    assert settings.keepalive_for("m").streaming == "off"


def test_six_field_crons_put_seconds_first() -> None:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from swapgate.config.cron import cron_trigger

    start = datetime(2026, 12, 2, 10, 0, 0, tzinfo=ZoneInfo("UTC"))
    every_ten = cron_trigger("*/10 * * * * *", "UTC")
    assert every_ten.get_next_fire_time(None, start.replace(second=1)) == start.replace(second=10)
    weekday = cron_trigger("45 7 * * 1-5", "Europe/Berlin")
    fire = weekday.get_next_fire_time(None, start)
    assert fire.isoformat() == "2026-12-03T07:45:00+01:00"


def test_protocols_default_to_openai_and_name_what_is_known() -> None:
    settings = parse_config(
        {
            "instances": [
                {"name": "vllm", "url": "http://x"},
                {"name": "llama", "url": "http://y", "protocols": ["openai", "anthropic"]},
            ],
            "relays": {"cloud": {"url": "https://api.example/v1", "protocols": ["anthropic"]}},
        }
    )
    assert [i.protocols for i in settings.instances] == [["openai"], ["openai", "anthropic"]]
    assert settings.relays["cloud"].protocols == ["anthropic"]
    with pytest.raises(ConfigError, match=re.escape("instances[0].protocols[0]: Input should be")):
        parse_config({"instances": [{"name": "x", "url": "http://x", "protocols": ["grpc"]}]})
    with pytest.raises(ConfigError, match=re.escape("instances[0].protocols: List should have")):
        parse_config({"instances": [{"name": "x", "url": "http://x", "protocols": []}]})


@pytest.mark.parametrize(
    ("choose", "message"),
    [
        ({"from": ["a", "nope"]}, "models.coder.choose.from: no instance serves 'nope'"),
        ({"from": ["coder"]}, "models.coder.choose.from: 'coder' is a selector"),
        ({"from": []}, "models.coder.choose.from: List should have at least 1 item"),
        ({"from": ["a"], "strategy": "best"}, "models.coder.choose.strategy: Input should be"),
    ],
)
def test_a_selector_names_served_models_and_says_what_is_wrong(
    choose: dict[str, object], message: str
) -> None:
    config = {
        "instances": [{"name": "x", "url": "http://x", "models": ["a", "b"]}],
        "models": {"coder": {"choose": choose}},
    }
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(config)


def test_a_selector_is_no_model_an_instance_serves() -> None:
    config = {
        "instances": [{"name": "x", "url": "http://x", "models": ["a", "coder"]}],
        "models": {"coder": {"choose": {"from": ["a"]}}},
    }
    with pytest.raises(ConfigError, match="'coder' is a model an instance serves"):
        parse_config(config)
    ok = parse_config({**config, "instances": [{"name": "x", "url": "http://x", "models": ["a"]}]})
    choose = ok.models["coder"].choose
    assert choose is not None
    assert (choose.targets, choose.strategy) == (["a"], "warm")
