"""The admin token does everything; a viewer's token only reads (docs/configuration.md, auth)."""

from __future__ import annotations

import pytest

from swapgate.errors import Forbidden, PathNotFound, SwapgateError, Unauthorized
from swapgate.proxy.auth import AdminAuth


def offering(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


@pytest.mark.parametrize(
    ("token", "write", "refused"),
    [
        ("adm-7f3a", False, None),
        ("adm-7f3a", True, None),
        ("vw-91c2", False, None),
        ("vw-91c2", True, Forbidden),
        ("bad-00aa", False, Unauthorized),
        ("bad-00aa", True, Unauthorized),
    ],
)
def test_who_may_read_and_who_may_change(
    token: str, write: bool, refused: type[SwapgateError] | None
) -> None:
    auth = AdminAuth("adm-7f3a", "vw-91c2")
    if refused is None:
        auth.check(offering(token), "/admin/preload", write=write)
    else:
        with pytest.raises(refused) as error:
            auth.check(offering(token), "/admin/preload", write=write)
        assert token not in error.value.message, "no token is ever said back"


def test_a_viewer_token_alone_opens_the_reading_and_nothing_else() -> None:
    auth = AdminAuth(None, "viewer")
    auth.check(offering("viewer"), "/admin/state", write=False)
    with pytest.raises(PathNotFound, match="admin API is off"):
        auth.check(offering("viewer"), "/admin/preload", write=True)
    with pytest.raises(PathNotFound):
        AdminAuth(None, None).check(offering("viewer"), "/admin/state", write=False)


def test_captures_are_the_operators_to_read_not_a_viewers() -> None:
    auth = AdminAuth("admin", "viewer")
    auth.check(offering("admin"), "/admin/captures/req-1", write=False)
    auth.check(offering("viewer"), "/admin/activity", write=False)
    with pytest.raises(Forbidden, match="holds what clients sent"):
        auth.check(offering("viewer"), "/admin/captures/req-1", write=False)
