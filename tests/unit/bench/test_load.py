"""The benchmark reads wrk's report right (a wrong parse would make every figure wrong)."""

from __future__ import annotations

import pytest

from bench.load import _parse_wrk

WRK_OUTPUT = """Running 10s test @ http://127.0.0.1:4000/v1/chat/completions
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    13.21ms    6.02ms  88.10ms   83.11%
    Req/Sec   612.35     70.13   790.00     71.00%
  Latency Distribution
     50%   12.41ms
     75%   14.90ms
     90%   19.31ms
     99%    1.20s
  12247 requests in 10.01s, 5.61MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   1223.55
Transfer/sec:    573.90KB
"""


def test_wrk_report_is_parsed() -> None:
    result = _parse_wrk(WRK_OUTPUT)
    assert result.requests == 12247
    assert result.rps == 1223.55
    assert result.p50_ms == 12.41
    assert result.p99_ms == 1200.0
    assert result.errors == 7


def test_microsecond_latencies() -> None:
    output = WRK_OUTPUT.replace("12.41ms", "812.00us").replace("1.20s", "950us")
    result = _parse_wrk(output)
    assert result.p50_ms == pytest.approx(0.812)
    assert result.p99_ms == pytest.approx(0.95)


def test_replay_errors_are_told_by_status() -> None:
    from bench.replay import describe_errors

    assert describe_errors([]) == "0"
    assert describe_errors([(0, 1), (503, 2)]) == "3 (no answer×1, 503×2)"
