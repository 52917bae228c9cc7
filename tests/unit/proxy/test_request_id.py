from __future__ import annotations

import uuid

from swapgate.proxy.request_id import MAX_CLIENT_ID, new_request_id, request_id


def test_generated_ids_are_distinct_version_4_uuids() -> None:
    ids = [request_id([]) for _ in range(1000)]
    assert len(set(ids)) == 1000
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value  # canonical form, as strict engines compare it
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_clients_own_id_is_kept_unchanged() -> None:
    assert request_id([(b"x-request-id", b"trace-42")]) == "trace-42"


def test_an_empty_or_oversized_client_id_is_replaced_by_a_uuid() -> None:
    for value in (b"", b"x" * (MAX_CLIENT_ID + 1)):
        replaced = request_id([(b"x-request-id", value)])
        assert replaced != value.decode()
        assert uuid.UUID(replaced).version == 4


def test_consecutive_ids_differ_only_in_the_counter() -> None:
    first, second = new_request_id(), new_request_id()
    assert first[:19] == second[:19]
    assert int(second[-17:].replace("-", ""), 16) - int(first[-17:].replace("-", ""), 16) == 1
