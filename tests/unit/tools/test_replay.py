"""``swapgate replay``'s pure parts: reading swapgate's log, and variants of a config."""

from __future__ import annotations

from pathlib import Path

import pytest

from swapgate.tools.replay import ReplayError, read_log, variant

LOG = """\
2026-12-04 10:00:00,500 INFO swapgate.control.swaps: swap start: a on gpu (evicting none)
2026-12-04 10:00:02,000 INFO swapgate.control.swaps: swap done (load): a on gpu in 1.50s
2026-12-04 10:00:02,100 INFO swapgate.access: "POST /v1/chat/completions" 200 model=a \
route=instance/gpu wait_ms=1500 ms=1600.0 id=1
2026-12-04 10:00:03,000 INFO swapgate.access: "POST /v1/chat/completions" 404 model=zzz \
route=none wait_ms=0 ms=0.4 id=2
swapgate-1  | 2026-12-04 10:00:04,250 INFO swapgate.access: "POST /v1/embeddings" 503 \
model=b route=instance/gpu wait_ms=120000 ms=120000.5 id=3
2026-12-04 10:00:05,000 INFO swapgate.control.swaps: swap done (wake): b on gpu in 0.40s
2026-12-04 10:00:06,000 INFO swapgate.control.swaps: swap done (load): b on big in 4.00s
"""


def test_the_log_gives_arrivals_service_times_and_measured_swaps() -> None:
    recording = read_log(LOG.splitlines())
    b, a = recording.requests  # in order of arrival; the 404 never reached a model
    assert b.at == 0.0
    assert b.model == "b"
    assert b.status == 503
    assert a.model == "a"
    assert a.at == pytest.approx(120.0 - 4.25 + 2.1 - 1.6, abs=1e-3)
    assert a.service == pytest.approx(0.1)
    assert recording.swaps == 3
    assert recording.swap_time("b", None, "big") == 4.0
    assert recording.swap_time("b", None, "gpu") == 0.4
    assert recording.swap_time("b", None) == pytest.approx(2.2)  # the model's, anywhere
    assert recording.swap_time("a", None) == 1.5
    assert recording.swap_time("a", None, "gpu") == 1.5  # measured there
    assert recording.swap_time("a", None, "elsewhere") == 1.5  # measured anywhere
    assert recording.swap_time("c", None) == 1.5  # unmeasured: every swap's median
    assert recording.swap_time("c", 20.0) == 20.0


def test_a_log_without_access_lines_says_what_replay_reads() -> None:
    with pytest.raises(ReplayError, match="access_log"):
        read_log(["2026-12-04 10:00:00,500 INFO swapgate.control.swaps: swap start: a on gpu"])


def test_no_measured_swaps_asks_for_a_swap_time() -> None:
    recording = read_log(LOG.splitlines()[2:4])
    with pytest.raises(ReplayError, match="--swap-time"):
        recording.swap_time("a", None)


BASE = {"routing": {"eviction": "lru"}, "instances": [{"name": "gpu", "url": "http://x"}]}


def test_variants_set_dotted_keys_and_resize_the_instances() -> None:
    changed = variant(BASE, "routing.eviction=demand, routing.min_residency=60s, instances=3")
    assert changed["routing"] == {"eviction": "demand", "min_residency": "60s"}
    assert [i["name"] for i in changed["instances"]] == ["gpu", "gpu-1", "gpu-2"]
    assert BASE["routing"] == {"eviction": "lru"}  # the base is not changed
    assert variant(BASE, "models.a.max_wait=5s")["models"] == {"a": {"max_wait": "5s"}}


def test_a_variant_may_be_a_whole_config_file(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("instances: [{name: big, url: 'http://y'}]\n")
    assert variant(BASE, str(path)) == {"instances": [{"name": "big", "url": "http://y"}]}


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("eviction", "KEY=VALUE"),
        ("instances=0", "whole number"),
        ("routing.eviction.x=1", "section"),
    ],
)
def test_a_bad_variant_says_how_to_write_one(spec: str, says: str) -> None:
    with pytest.raises(ReplayError, match=says):
        variant(BASE, spec)
