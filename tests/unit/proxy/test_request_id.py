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


def test_a_forked_process_makes_ids_of_its_own() -> None:
    """Every gateway the tests' zygote forks (and any server that forks workers) would otherwise
    make its parent's ids, one for one."""
    import os

    parent = new_request_id()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and exits at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        childs = pipe.read()
    assert uuid.UUID(childs).version == 4
    assert childs[:19] != parent[:19], "the child drew its own prefix"
    assert new_request_id()[:19] == parent[:19], "the parent's is unchanged"
