"""How the config and the command line read a duration: ``250ms``, ``5s``, ``2m``, ``1h`` or
plain seconds (docs/configuration.md). Apart from the config's models, so that a command that
reads a duration (``swapgate sim --load-time 2s``) does not load them."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> object:
    """Accept ``250ms``, ``5s``, ``2m``, ``1h`` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("not a duration: use e.g. 250ms, 5s, 2m, 1h or a number of seconds")
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int beyond float's range: YAML reads any run of digits
            raise ValueError("not a duration: too many seconds to represent") from None
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return float(match[1]) * _UNIT_SECONDS[match[2]]
        raise ValueError(f"not a duration: {value!r}; use e.g. 250ms, 5s, 2m, 1h or seconds")
    return value
