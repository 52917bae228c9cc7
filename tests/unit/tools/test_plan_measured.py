"""``swapgate plan --measured``: a running gateway's measured figures beside the declared ones,
each instance's fits by the larger (docs/memory.md, "Measured memory")."""

from __future__ import annotations

from swapgate.config.loading import parse_config
from swapgate.tools.plan import as_json, make_plan, measured_from, render

GiB = 2**30
SETTINGS = parse_config(
    {
        "instances": [{"name": "gpu", "url": "http://gpu", "memory": "24GiB"}],
        "models": {"big": {"memory": "2GiB"}, "other": {"memory": "20GiB"}},
    }
)
STATE = {
    "instances": [
        {
            "name": "gpu",
            "model_sizes": {
                "big": {"estimate": 2 * GiB, "measured": 9 * GiB, "measured_by": "rss"},
                "other": {"estimate": 20 * GiB},
            },
        }
    ]
}


def test_the_measured_figures_are_read_from_admin_state() -> None:
    assert measured_from(STATE) == {"gpu": {"big": 9 * GiB}}


def test_without_measurements_the_plan_is_the_declared_one() -> None:
    plan = make_plan(SETTINGS)
    assert plan.instances[0]["fits_at_once"] == ["big", "other"]
    assert plan.warnings == []
    assert "MEASURED" not in render(plan)


def test_a_model_measured_larger_leaves_no_room_for_what_the_declared_figures_fit() -> None:
    plan = make_plan(SETTINGS, measured_from(STATE))
    assert plan.instances[0]["fits_at_once"] == ["big"], "9 + 20 GiB is over 24 GiB"
    [warning] = plan.warnings
    assert warning.startswith("big: measured at 9 GiB, more than 10% above its declared 2 GiB")
    assert "raise models.big.memory to at least 9 GiB" in warning
    text = render(plan)
    header = next(line for line in text.splitlines() if line.startswith("MODEL"))
    assert header.split()[-2:] == ["TOTAL", "MEASURED"]
    big = next(line for line in text.splitlines() if line.startswith("big "))
    assert big.split()[-2:] == ["9", "GiB"]
    models = as_json(plan)["models"]
    assert (models["big"]["measured"], models["other"]["measured"]) == (9 * GiB, None)
