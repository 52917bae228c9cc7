"""Requests waiting on an instance for its first byte, ended when it is declared down
(docs/operations.md, "When part of the fleet breaks").

A hung engine (wedged in a GPU call, or stopped) still accepts connections: a request sent to
it waits for an answer that never comes, until its read timeout. Once the instance is known
down (the poller, or another request it refused), every request still waiting on it ends:
``watch`` wraps the wait for the upstream's answer, ``cut`` cancels the waits on an instance,
and each ends with ``InstanceDown`` naming it. Such a request may have run (the engine read it
before it hung), so it is never sent elsewhere.

It costs the request path a set insert and removal: no task, no timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from swapgate.errors import InstanceDown


class Hangups:
    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Task[object]]] = {}
        self._cut: set[asyncio.Task[object]] = set()

    @contextmanager
    def watch(self, instance: str) -> Iterator[None]:
        """The caller's task waits on ``instance`` for its first byte while inside."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        waiting = self._waiting.setdefault(instance, set())
        waiting.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            self._cut.discard(task)
            task.uncancel()
            raise InstanceDown(
                f"{instance} was declared down while it held this request, before any answer;"
                " it may have run it, so it was not sent elsewhere: retry the request"
            ) from None
        finally:
            waiting.discard(task)
            self._cut.discard(task)

    def cut(self, instance: str) -> int:
        """End every wait on ``instance``; returns how many."""
        waiting = self._waiting.pop(instance, set())
        for task in waiting:
            self._cut.add(task)
            task.cancel()
        return len(waiting)
