"""Background tasks, written once: ``stop`` cancels tasks and waits until they ended, and
``TaskSet`` keeps fire-and-forget tasks alive until they end or are stopped.

A task's own error or cancellation stays the task's; a cancellation of the caller that arrives
while it waits goes on (shutdown must not be swallowed by what it stops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def stop(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel ``tasks`` (None and finished ones are skipped) and wait until every one ended."""
    pending = [task for task in tasks if task is not None and not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in pending:
        if not task.cancelled():
            task.exception()  # retrieved: an error on the way out is not worth a warning


class TaskSet:
    """Tasks nobody awaits, kept referenced until they end (asyncio keeps only weak ones)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, object], name: str | None = None) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __len__(self) -> int:
        return len(self._tasks)

    async def finish(self) -> None:
        """Wait until the running ones ended by themselves."""
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        """Stop the running ones."""
        await stop(*self._tasks)
