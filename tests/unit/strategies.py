"""Hypothesis strategies and settings the property tests share: any scalar, any JSON value."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Bounded so the file runs in seconds on two busy cores; a slow draw is not a failure.
BOUNDED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
# What JSON can hold: no NaN or infinity (a body with them is a 400, tested on its own).
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
