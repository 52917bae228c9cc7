"""What ``make run`` prints: where everything is, the dashboard first."""

from __future__ import annotations

from pathlib import Path

from swapgate.config.loading import parse_config
from swapgate.tools.demo import _instructions, keeping_kv


def test_the_demo_says_where_the_dashboard_is_and_its_token() -> None:
    settings = parse_config(
        {"server": {"port": 8080}, "instances": [{"name": "x", "url": "http://127.0.0.1:9001"}]}
    )
    text = _instructions(settings, 2.0, token="t0ken")
    assert "The dashboard: http://127.0.0.1:8080/ui (sign in with the admin token t0ken)" in text


def test_with_real_llama_swaps_the_demo_keeps_conversations_across_swaps(tmp_path: Path) -> None:
    settings = parse_config(
        {"instances": [{"name": "gpu-a", "url": "http://127.0.0.1:9101", "models": ["a", "b"]}]}
    )
    kept = keeping_kv(settings, tmp_path)
    assert kept.instances[0].kv_folder == tmp_path / "gpu-a", "its llama-servers' save path"
    assert "kv_restores_total" in _instructions(kept, 2.0, engine="llama-swap")
    assert "kv_restores_total" not in _instructions(settings, 2.0)
