from __future__ import annotations

import pytest

from swapgate.errors import BadRequest
from swapgate.proxy.request import parse_request


@pytest.mark.parametrize("depth", [2_000, 20_000])
def test_a_deeply_nested_body_is_a_400_not_a_crash(depth: int) -> None:
    body = b'{"model": "a", "x": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(BadRequest, match="nested too deeply"):
        parse_request(body)


def test_a_plain_body_still_parses() -> None:
    payload, model, stream = parse_request(b'{"model": "a", "stream": true, "x": [[[1]]]}')
    assert (model, stream, payload["x"]) == ("a", True, [[[1]]])


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_not_json(constant: bytes) -> None:
    with pytest.raises(BadRequest, match="not a JSON value"):
        parse_request(b'{"model": "a", "temperature": ' + constant + b"}")
