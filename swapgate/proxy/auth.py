"""Who may call: client keys for ``/v1`` (docs/keys.md), the operator's and a viewer's token for
``/admin`` (docs/operations.md).

Client keys are found by their SHA-256, tokens compared in constant time, and no key or token
ever appears in a response or a log line: a key is known there by its configured name.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from swapgate.config.settings import KeyConfig, parse_priority
from swapgate.errors import BadRequest, Forbidden, ModelNotAllowed, PathNotFound, Unauthorized

PRIORITY_HEADER = b"x-swapgate-priority"


def bearer(headers: Sequence[tuple[bytes, bytes]], *, x_api_key: bool = False) -> bytes | None:
    """The credential a request offers: ``Authorization: Bearer``, or ``x-api-key`` if allowed."""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
        if x_api_key and name == b"x-api-key":
            return value.strip()
    return None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: a key's name (in metrics, logs and errors; never the key itself) and
    its scope, class and limits. ``key`` is None for a key of the plain list
    (``SWAPGATE_API_KEYS``): every model, no limits. ``name`` is None when keys are off."""

    name: str | None = None
    key: KeyConfig | None = None
    scope: re.Pattern[str] | None = None  # its models (``scope``); None: every model

    @property
    def priority(self) -> int:
        return self.key.priority if self.key is not None else 0


ANYONE = Caller()


class ClientAuth:
    """The client keys (docs/keys.md): the configured ones (``auth.keys``, by their SHA-256) and
    the plain list in ``server.api_keys_env``. No key configured: anyone may call."""

    def __init__(
        self,
        plain: Sequence[str],
        keys: Sequence[KeyConfig] = (),
        plain_name: str = "SWAPGATE_API_KEYS",
        clock: Callable[[], float] = time.time,
    ) -> None:
        unscoped = Caller(plain_name)
        self._callers = {hashlib.sha256(k.encode()).hexdigest(): unscoped for k in plain}
        self._callers |= {key.sha256: Caller(key.name, key, scope(key.models)) for key in keys}
        self._clock = clock

    @property
    def on(self) -> bool:
        return bool(self._callers)

    def check(self, headers: Sequence[tuple[bytes, bytes]]) -> Caller:
        """The caller whose key the request offers; 401 for none, a wrong or an expired one.
        The key is looked up by its SHA-256: comparing digests tells nothing of the key."""
        if not self._callers:
            return ANYONE
        offered = bearer(headers, x_api_key=True)
        caller = self._callers.get(hashlib.sha256(offered).hexdigest()) if offered else None
        if caller is None:
            raise Unauthorized(
                "missing or wrong API key; send 'Authorization: Bearer KEY' with a key "
                "from the gateway's operator"
            )
        expires = caller.key.expires if caller.key is not None else None
        if expires is not None and self._clock() >= _day_after(expires):
            raise Unauthorized(
                f"the key {caller.name!r} expired on {expires.isoformat()}; ask the gateway's "
                "operator for a new one"
            )
        return caller

    def allows(self, caller: Caller, *models: str) -> bool:
        """Whether ``caller`` may use a model known by any of ``models`` (its name as asked,
        and the model that name stands for)."""
        return in_scope(caller.scope, models)

    def check_model(self, caller: Caller, *models: str) -> None:
        """403 ``model_not_allowed`` for a model outside ``caller``'s scope: the same answer
        whether or not the model exists, so that a key learns nothing beyond its scope."""
        if not self.allows(caller, *models):
            assert caller.key is not None
            raise ModelNotAllowed(
                f"the key {caller.name!r} may not use the model {models[0]!r}; it may use "
                f"{', '.join(caller.key.models)} (GET /v1/models lists them)",
                param="model",
            )

    def priority(self, caller: Caller, headers: Sequence[tuple[bytes, bytes]]) -> int:
        """The request's class: its key's, or ``x-swapgate-priority``'s where the key allows it
        (any key may lower its class; raising it takes ``priority_header``)."""
        asked = _asked_priority(headers)
        if asked is None:
            return caller.priority
        key = caller.key
        if key is None or key.priority_header or asked <= key.priority:
            return asked
        return key.priority


def in_scope(scope: re.Pattern[str] | None, models: Iterable[str]) -> bool:
    """Whether a key's ``scope`` (from ``scope``; None: every model) takes any of ``models``."""
    return scope is None or any(scope.fullmatch(model) for model in models)


def scope(patterns: Sequence[str]) -> re.Pattern[str] | None:
    """One regular expression for a key's model patterns (globs); None for every model."""
    if "*" in patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _day_after(day: date) -> float:
    """When a key that works through ``day`` (UTC) stops: the next midnight, as a timestamp."""
    return datetime.combine(day, datetime.min.time(), UTC).timestamp() + 86_400


def _asked_priority(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == PRIORITY_HEADER:
            text = value.decode("latin-1")
            try:
                parsed = parse_priority(text)
            except ValueError as exc:
                raise BadRequest(f"x-swapgate-priority: {exc}") from None
            assert isinstance(parsed, int)
            return parsed
    return None


# Reads a viewer's token may not make: request captures hold what clients sent.
OPERATOR_READS = ("/admin/captures/",)


class AdminAuth:
    """The operator's token (everything), and a viewer's (reading only: the admin API's GET
    routes but ``OPERATOR_READS``, the event stream, the dashboard)."""

    def __init__(self, token: str | None, viewer: str | None = None) -> None:
        self._token = token.encode() if token else None
        self._viewer = viewer.encode() if viewer else None

    @property
    def on(self) -> bool:
        """Whether the admin API is on (its token set)."""
        return self._token is not None

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
            if path.startswith(OPERATOR_READS):
                raise Forbidden(
                    f"{path} holds what clients sent: it takes the admin token "
                    "(SWAPGATE_ADMIN_TOKEN), not a viewer's"
                )
            return
        raise Unauthorized(
            "missing or wrong admin token; send 'Authorization: Bearer TOKEN' "
            "(the swapgate CLI takes --token or SWAPGATE_ADMIN_TOKEN)"
        )


def _matches(offered: bytes, expected: bytes | None) -> bool:
    return expected is not None and hmac.compare_digest(offered, expected)
