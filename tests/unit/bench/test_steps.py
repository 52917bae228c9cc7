"""bench/steps.py reads each pipeline step's time from a profile by its file and function."""

from __future__ import annotations

import cProfile
import pstats

from bench.steps import STEPS, _cumulative


def test_every_step_names_a_function_that_exists() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    for step in STEPS:
        source = (root / step.file).read_text()
        assert f"def {step.function}(" in source, step


def test_a_step_sums_its_function_wherever_the_package_lies() -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    profiler.disable()
    stats = pstats.Stats(profiler)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, dict[object, object]]] = {
        ("/x/swapgate/proxy/pipeline/admit.py", 62, "admit"): (2, 2, 0.1, 0.25, {}),
        ("/y/swapgate/proxy/pipeline/admit.py", 62, "admit"): (1, 1, 0.1, 0.5, {}),
        ("/x/swapgate/proxy/pipeline/admit.py", 103, "_conversation"): (1, 1, 0.1, 9.0, {}),
        ("/x/elsewhere/admit.py", 1, "admit"): (1, 1, 0.1, 7.0, {}),
    }
    stats.stats = table  # type: ignore[attr-defined]  # (file, line, function) -> figures
    found = _cumulative(stats)
    assert found["admit"] == 0.75
    assert found["place"] == 0.0
    assert set(found) == {step.name for step in STEPS}
