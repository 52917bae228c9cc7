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


class _Ids:
    """This process's prefix and counter. A forked child draws its own (``os.register_at_fork``):
    it would make its parent's ids otherwise, as every gateway the tests' zygote forks did."""

    def __init__(self) -> None:
        self.draw()

    def draw(self) -> None:
        random = os.urandom(8).hex()
        # xxxxxxxx-xxxx-4xxx-8ccc-cccccccccccc: 15 random hex digits, then a 60-bit counter.
        self.prefix = f"{random[:8]}-{random[8:12]}-4{random[12:15]}-8"
        self.counter = itertools.count(1)

    def next(self) -> str:
        tail = f"{next(self.counter) & 0xFFF_FFFF_FFFF_FFFF:015x}"
        return f"{self.prefix}{tail[:3]}-{tail[3:]}"


_IDS = _Ids()
os.register_at_fork(after_in_child=_IDS.draw)


def new_request_id() -> str:
    return _IDS.next()


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``x-request-id``, forwarded unchanged, or a new one."""
    for name, value in headers:
        if name == HEADER and 0 < len(value) <= MAX_CLIENT_ID:
            return value.decode("latin-1")
    return new_request_id()
