"""``swapgate activity``'s table: a row per request, its swap by id, the page before."""

from __future__ import annotations

from swapgate.tools.activity_cli import render_activity, render_usage


def _row(**fields: object) -> dict[str, object]:
    row = {
        "id": 911,
        "at": 1_700_000_000.0,
        "key": "chat-ui",
        "model": "qwen",
        "instance": "gpu-a",
        "placement": "swap",
        "swap_id": 37,
        "wait_ms": 24_100.0,
        "ttft_ms": 24_310.0,
        "duration_ms": 25_020.0,
        "tokens_in": 12,
        "tokens_out": 40,
        "status": 200,
        "error": "",
        "request_id": "9e77",
    }
    return {**row, **fields}


def test_a_row_per_request_with_its_swap_and_the_next_page() -> None:
    refused = _row(
        id=910,
        key=None,
        instance=None,
        placement="refused",
        swap_id=None,
        wait_ms=None,
        ttft_ms=None,
        duration_ms=3.0,
        tokens_in=None,
        tokens_out=None,
        status=429,
        error="rate_limited",
        request_id="0d2f",
    )
    text = render_activity({"rows": [_row(), refused], "next_before": 910})
    swap_line, refused_line = text.splitlines()[1:3]
    assert swap_line.split()[3:12] == [
        "qwen",
        "gpu-a",
        "swap",
        "#37",
        "24.10s",
        "24.31s",
        "25.02s",
        "12→40",
        "200",
    ]
    assert "429 rate_limited" in refused_line
    assert refused_line.split()[5:7] == ["refused", "-"]
    assert text.endswith("older: --before 910")


def test_nothing_recorded_says_so() -> None:
    assert render_activity({"rows": [], "next_before": None}) == "no requests recorded"
    off: dict[str, object] = {"rows": [], "next_before": None, "recording": False}
    assert render_activity(off) == "no requests recorded (activity off)"


def test_usage_is_a_table_most_tokens_first_with_the_total() -> None:
    sums = {
        "since": 0.0,
        "by": "key",
        "recording": True,
        "rows": [
            {"key": "alice", "requests": 1200, "prompt_tokens": 900_000,
             "completion_tokens": 100_000, "total_tokens": 1_000_000},
            {"key": None, "requests": 3, "prompt_tokens": 7, "completion_tokens": 2,
             "total_tokens": 9},
        ],
    }  # fmt: skip
    lines = render_usage(sums).splitlines()
    assert lines[1].split() == ["KEY", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"]
    assert lines[2].split() == ["alice", "1,200", "900,000", "100,000", "1,000,000"]
    assert lines[3].split() == ["(no", "key)", "3", "7", "2", "9"]
    assert lines[4].split() == ["all", "1,203", "900,007", "100,002", "1,000,009"]
    empty = render_usage({**sums, "rows": [], "recording": False})
    assert empty == "no requests recorded (activity off)"
