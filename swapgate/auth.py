"""Who may call: client keys for ``/v1``, the operator's token for ``/admin`` (docs/architecture.md,
docs/operations.md).

Every comparison is constant-time, and no key or token ever appears in a response or a log line.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from swapgate.errors import PathNotFound, Unauthorized


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
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def check(self, headers: Sequence[tuple[bytes, bytes]], path: str) -> None:
        if self._token is None:
            raise PathNotFound(
                f"no endpoint at {path}; the admin API is off until the gateway's "
                "server.admin_token_env variable (SWAPGATE_ADMIN_TOKEN) is set"
            )
        offered = bearer(headers)
        if offered is None or not hmac.compare_digest(offered, self._token):
            raise Unauthorized(
                "missing or wrong admin token; send 'Authorization: Bearer TOKEN' "
                "(the swapgate CLI takes --token or SWAPGATE_ADMIN_TOKEN)"
            )
