"""Per-client caps: one client key cannot take every slot while others wait.

A client key with `max_concurrent: N` (in `client_keys`) has at most N requests holding or
waiting for a slot at once in this process; its further requests wait here, outside the
shared FIFO queue, so other clients' requests are never queued behind a flood from one key.
Among waiting clients that frees a slot in turn (each key's own requests in order): in
effect round-robin between keys instead of strict FIFO. Trade-off: the cap counts per
process — under `--workers N` or several instances a key may hold up to N × its cap.

Requests held aside here are queued requests like any other: they count toward `max_queue`
(the store sees their number as `held_aside`), so one key cannot buffer without bound — past
the queue's size its further requests are refused at once (503 `queue_full` + Retry-After)
instead of each holding a body, a task and a connection. Under several workers the count is
this process's: each worker bounds what it holds aside by `max_queue`.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from typing import TypeGuard

from ..state import QueueFull, StateStore


class ClientLimits:
    def __init__(self, caps: dict[str, int], store: StateStore, max_queue: int) -> None:
        self.caps = caps
        self.store = store
        self.max_queue = max_queue
        self._active: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def capped(self, client: str | None) -> TypeGuard[str]:
        return client is not None and client in self.caps

    def full(self, client: str) -> bool:
        """Would `client`'s next request have to wait, with no room left in the queue?"""
        if client not in self.caps or self._active[client] < self.caps[client]:
            return False
        return self.store.held_aside + self.store.queue_length() >= self.max_queue

    async def enter(self, client: str, timeout: float) -> None:
        """Wait for one of `client`'s permits (raises TimeoutError after `timeout`, QueueFull
        at once when the router's queue has no room for one more waiter)."""
        if self._active[client] < self.caps[client]:
            self._active[client] += 1
            return
        if self.full(client):
            raise QueueFull(client)
        store = self.store
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.setdefault(client, deque())
        queue.append(fut)
        store.held_aside += 1
        try:
            async with asyncio.timeout(timeout):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.leave(client)  # handed a permit just as we gave up: pass it on
            else:
                fut.cancel()
                if fut in queue:
                    queue.remove(fut)
            raise
        finally:
            store.held_aside -= 1
            if not queue and self._waiting.get(client) is queue:
                del self._waiting[client]

    def leave(self, client: str) -> None:
        queue = self._waiting.get(client)
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)  # the permit passes straight to the next waiter
                return
        self._active[client] -= 1
