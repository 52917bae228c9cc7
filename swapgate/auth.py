"""Who may call: client keys for ``/v1``, the operator's token for ``/admin`` (docs/architecture.md,
docs/operations.md).

Every comparison is constant-time, and no key or token ever appears in a response or a log line.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from swapgate.errors import Forbidden, PathNotFound, Unauthorized


def bearer(headers: Sequence[tuple[bytes, bytes]], *, x_api_key: bool = False) -> bytes | None:
    """The credential a request offers: ``Authorization: Bearer``, or ``x-api-key`` if allowed."""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
        if x_api_key and name == b"x-api-key":
            return value.strip()
    return None


class ClientAuth:
    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [key.encode() for key in keys]

    def check(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        if not self._keys:
            return
        offered = bearer(headers, x_api_key=True)
        if offered is None or not any(hmac.compare_digest(offered, k) for k in self._keys):
            raise Unauthorized(
                "missing or wrong API key; send 'Authorization: Bearer KEY' with a key "
                "from the gateway's operator"
            )


class AdminAuth:
    """The operator's token (everything), and a viewer's (reading only: the admin API's GET
    routes, the event stream, the dashboard)."""

    def __init__(self, token: str | None, viewer: str | None = None) -> None:
        self._token = token.encode() if token else None
        self._viewer = viewer.encode() if viewer else None

    def check(self, headers: Sequence[tuple[bytes, bytes]], path: str, *, write: bool) -> None:
        if self._token is None and (write or self._viewer is None):
            raise PathNotFound(
                f"no endpoint at {path}; the admin API is off until the gateway's "
                "server.admin_token_env variable (SWAPGATE_ADMIN_TOKEN) is set"
            )
        offered = bearer(headers)
        if offered is not None and _matches(offered, self._token):
            return
        if offered is not None and _matches(offered, self._viewer):
            if write:
                raise Forbidden(
                    f"a viewer's token only reads; {path} changes the gateway and takes the "
                    "admin token (SWAPGATE_ADMIN_TOKEN)"
                )
            return
        raise Unauthorized(
            "missing or wrong admin token; send 'Authorization: Bearer TOKEN' "
            "(the swapgate CLI takes --token or SWAPGATE_ADMIN_TOKEN)"
        )


def _matches(offered: bytes, expected: bytes | None) -> bool:
    return expected is not None and hmac.compare_digest(offered, expected)
