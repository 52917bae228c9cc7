"""Properties over any input: the request parser raises only ``BadRequest`` (a 400), and the
body reader returns the body or says why not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from swapgate.errors import BadRequest, RequestTooLarge
from swapgate.proxy.request import parse_request, read_body
from tests.unit.strategies import BOUNDED, JSON

# --- the request parser ---------------------------------------------------------------------


def parsed_or_400(body: bytes) -> tuple[dict[str, Any], str, bool] | None:
    """What ``parse_request`` made of ``body``, or None for a 400; anything else escapes."""
    try:
        payload, model, stream = parse_request(body)
    except BadRequest as exc:
        failure = exc
    else:
        assert isinstance(payload, dict)
        assert isinstance(model, str)
        assert model
        assert payload["model"] == model
        assert isinstance(stream, bool)
        return payload, model, stream
    assert failure.status == 400
    assert failure.message
    return None


JSON_TOKENS = [
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b" ",
    b'"model"',
    b'"stream"',
    b'"a"',
    b'""',
    b"true",
    b"null",
    b"1e400",
    b"-1e400",
    b"0.1e-99999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"9" * 5000,
    b'"\\ud800"',
    b'"\\u12"',
    b'"\\x"',
    b"\xff",
    b"\xc3",
    b"\xef\xbb\xbf",
    b"\x00",
]
TOKEN_SOUP = st.lists(st.sampled_from(JSON_TOKENS), max_size=24).map(b"".join)
ENCODED_JSON = st.builds(
    lambda value, encoding: json.dumps(value).encode(encoding),
    JSON,
    st.sampled_from(["utf-8", "utf-16", "utf-32", "utf-8-sig"]),
)


@BOUNDED
@given(st.binary(max_size=200) | TOKEN_SOUP | ENCODED_JSON)
@example(b"\xff\xfe\x00")
@example(b'{"model": "a", "n": ' + b"9" * 5000 + b"}")
@example(b'{"model": "a", "n": 1e400, "m": NaN}')
def test_any_body_is_parsed_or_a_400(body: bytes) -> None:
    parsed_or_400(body)


def objects(model: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    optional = {"model": model, "stream": JSON | st.booleans()}
    extra = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in optional), JSON)
    return st.builds(
        lambda base, more: {**more, **base}, st.fixed_dictionaries({}, optional=optional), extra
    )


@BOUNDED
@given(objects(model=JSON | st.text() | st.just("")))
@example({"model": ""})
@example({"model": ["a"], "stream": True})
@example({"model": "a", "stream": 1})
def test_a_json_object_is_accepted_exactly_when_its_model_is_a_name(obj: dict[str, Any]) -> None:
    result = parsed_or_400(json.dumps(obj).encode())
    if isinstance(obj.get("model"), str) and obj["model"]:
        assert result is not None
        payload, model, stream = result
        assert model == obj["model"]
        assert stream is (obj.get("stream") is True)
        assert payload.keys() == obj.keys()
    else:
        assert result is None


@BOUNDED
@given(
    depth=st.integers(1, 50_000),
    opener=st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"a":', b"}]")]),
    in_object=st.booleans(),
)
@example(depth=50_000, opener=(b"[", b"]"), in_object=True)
@example(depth=50_000, opener=(b'{"a":', b"}"), in_object=False)
def test_deep_nesting_is_a_400_not_a_crash(
    depth: int, opener: tuple[bytes, bytes], in_object: bool
) -> None:
    nested = opener[0] * depth + b"1" + opener[1] * depth
    body = b'{"model": "a", "x": ' + nested + b"}" if in_object else nested
    result = parsed_or_400(body)
    if not in_object:
        assert result is None  # no "model" at the top, whatever the depth
    elif result is not None:
        assert result[1] == "a"


CHUNK = st.binary(max_size=64) | st.none()  # None: a message without a "body" key


@BOUNDED
@given(
    chunks=st.lists(CHUNK, max_size=8), last=CHUNK, limit=st.integers(0, 300), gone=st.booleans()
)
@example(chunks=[b"x" * 10], last=b"", limit=10, gone=False)
@example(chunks=[b"x" * 10], last=b"y", limit=10, gone=False)
def test_read_body_returns_the_body_or_says_why_not(
    chunks: list[bytes | None], last: bytes | None, limit: int, gone: bool
) -> None:
    messages: list[dict[str, Any]] = [_request(c, more_body=True) for c in chunks]
    messages.append({"type": "http.disconnect"} if gone else _request(last, more_body=None))
    sent = b"".join(c or b"" for c in [*chunks, None if gone else last])
    pending = iter(messages)

    async def receive() -> dict[str, Any]:
        return next(pending)  # past the end would be a bug: StopIteration escapes

    try:
        body = asyncio.run(read_body(receive, limit))
    except RequestTooLarge:
        assert len(sent) > limit
    except ConnectionAbortedError:
        assert gone
        assert len(sent) <= limit
    else:
        assert body == sent
        assert len(body) <= limit
        assert not gone


def _request(body: bytes | None, *, more_body: bool | None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "http.request"}
    if body is not None:
        message["body"] = body
    if more_body is not None:
        message["more_body"] = more_body
    return message
