"""``free_port`` never hands one port to two callers on this machine within RESERVED_FOR: a
slow server (vLLM starts in ~40 s) would find another test's gateway on it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from swapgate.drivers import children


@pytest.fixture
def marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    return tmp_path / f"swapgate-ports-{os.getuid()}"


def test_a_port_given_out_is_not_given_again_while_reserved(
    marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = children.free_port()
    assert (marks / str(first)).exists()
    # The kernel offers the same port again: it is skipped for the next one it offers
    offered = iter([first, first, first + 1])
    monkeypatch.setattr(children, "_port_offered", lambda: next(offered))
    assert children.free_port() == first + 1


def test_a_stale_reservation_is_taken_again(marks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = children.free_port()
    old = time.time() - children.RESERVED_FOR - 1
    os.utime(marks / str(first), (old, old))
    monkeypatch.setattr(children, "_port_offered", lambda: first)
    assert children.free_port() == first
    assert time.time() - (marks / str(first)).stat().st_mtime < 5
