"""Request ids: the client's own, or one swapgate makes that every engine accepts
(docs/compatibility.md).

llama-cpp-python's server answers 400 to an ``x-request-id`` that ``uuid.UUID`` cannot parse, so
generated ids are UUIDs: a random per-process prefix and a counter, laid out as a version-4 UUID
(version and variant bits set as RFC 9562 says). A counter costs a fraction of ``uuid4()``, and
the prefix keeps ids unique across restarts and replicas.
"""

from __future__ import annotations

import itertools
import os

HEADER = b"x-request-id"
MAX_CLIENT_ID = 128  # longer client ids are replaced, not forwarded

_RANDOM = os.urandom(8).hex()
# xxxxxxxx-xxxx-4xxx-8ccc-cccccccccccc: 15 random hex digits, then a 60-bit counter.
_PREFIX = f"{_RANDOM[:8]}-{_RANDOM[8:12]}-4{_RANDOM[12:15]}-8"
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    tail = f"{next(_COUNTER) & 0xFFF_FFFF_FFFF_FFFF:015x}"
    return f"{_PREFIX}{tail[:3]}-{tail[3:]}"


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``x-request-id``, forwarded unchanged, or a new one."""
    for name, value in headers:
        if name == HEADER and 0 < len(value) <= MAX_CLIENT_ID:
            return value.decode("latin-1")
    return new_request_id()
