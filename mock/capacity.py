"""Parallel slots with a bounded FIFO wait queue, like OLLAMA_NUM_PARALLEL / OLLAMA_MAX_QUEUE."""

from __future__ import annotations

import asyncio
from collections import deque


class QueueFull(Exception):
    pass


class Slots:
    def __init__(self, parallel: int, max_queue: int) -> None:
        self.parallel = parallel
        self.max_queue = max_queue
        self.active = 0
        self.max_active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        if self.active < self.parallel and not self._waiters:
            self._take()
            return
        if len(self._waiters) >= self.max_queue:
            raise QueueFull
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # the slot was handed to us just as we were cancelled
            else:
                self._waiters.remove(fut)
            raise

    def _take(self) -> None:
        self.active += 1
        if self.active > self.max_active:
            self.max_active = self.active

    def release(self) -> None:
        self.active -= 1
        self.wake()

    def wake(self) -> None:
        """Hand free slots to waiters in FIFO order (also after `parallel` grows)."""
        while self._waiters and self.active < self.parallel:
            fut = self._waiters.popleft()
            if not fut.done():
                self._take()
                fut.set_result(None)
