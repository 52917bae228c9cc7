"""What ``make run`` prints: where everything is, the dashboard first."""

from __future__ import annotations

from swapgate.config.loading import parse_config
from swapgate.tools.demo import _instructions


def test_the_demo_says_where_the_dashboard_is_and_its_token() -> None:
    settings = parse_config(
        {"server": {"port": 8080}, "instances": [{"name": "x", "url": "http://127.0.0.1:9001"}]}
    )
    text = _instructions(settings, 2.0, token="t0ken")
    assert "The dashboard: http://127.0.0.1:8080/ui (sign in with the admin token t0ken)" in text
