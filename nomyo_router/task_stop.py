"""Ending a background task for sure.

One `cancel()` is not always enough: redis-py, on Python 3.11, sends commands through
`asyncio.wait_for`, which returns the reply, and drops the cancel, when both arrive together.
A loop that talks to Redis (a flusher, a refresher, a pub/sub reader), cancelled in that
moment, carries on, and a shutdown that waits for it waits for ever: a worker then never
exits, and its supervisor waits on it until it is killed. `end` cancels until the task has
ended. It imports nothing of Redis, so every store and loop can use it."""

from __future__ import annotations

import asyncio


async def end(task: asyncio.Task[None]) -> None:
    """Cancel `task` until it has ended; what it raised is retrieved (never logged as lost)."""
    while not task.done():
        task.cancel()
        await asyncio.wait((task,), timeout=0.1)
    if not task.cancelled():
        task.exception()
