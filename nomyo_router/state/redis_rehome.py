"""Re-homing for RedisStore: after a reload (or a rediscovery) changed the endpoints serving a
model, this instance's requests waiting in Redis for that model go back to the scheduler,
which places them again among the endpoints as they are now, with their old queue order.

Two things make that exact:
- they leave in their queue order, and their new ACQUIRE calls reach Redis one at a time in
  that order (`in_turn`): otherwise several connections race, and a younger request could
  take a free slot of a new endpoint before an older one;
- the reload's new slot counts are written first (`gate`, taken by the store's registration
  before the requests come back), so that an endpoint the reload added is not seen with no
  slots by the requests it is meant for.

Nothing here runs for a request that gets its slot at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TypeGuard, TypeVar

from .base import Rehome

# What a waiter's future is woken with when it is sent back (endpoint names never are this).
REHOME = "\x00rehome"
T = TypeVar("T")


class Rehoming:
    def __init__(self) -> None:
        self.gate = asyncio.Lock()
        self._waiters: dict[str, tuple[str, int, float]] = {}  # waiter id -> (model, order, since)
        self._orders: set[int] = set()  # of requests sent back, until their ACQUIRE has run

    def queued(self, lid: str, model: str, order: int) -> None:
        self._waiters[lid] = (model, order, time.monotonic())

    def left(self, lid: str) -> None:
        self._waiters.pop(lid, None)

    def wake(self, models: Collection[str], waiting: dict[str, asyncio.Future[str | None]]) -> None:
        """Send back the waiters (futures in `waiting`, by id) for `models`, oldest first; and
        the requests whose ACQUIRE is on its way (with the old candidates, of a model not known
        here): should it queue, it comes back at once, else the answer stands."""
        wanted = set(models)
        mine = sorted((order, lid) for lid, (model, order, _) in self._waiters.items() if model in wanted)
        self._orders = {order for order, _ in mine}
        for lid in [lid for _, lid in mine] + [lid for lid in waiting if lid not in self._waiters]:
            fut = waiting.get(lid)
            if fut is not None and not fut.done():
                fut.set_result(REHOME)

    def signal(self, lid: str) -> Rehome:
        """What the waiter `lid`, woken with REHOME, raises to the scheduler."""
        model, order, since = self._waiters[lid]
        return Rehome(model, order, time.monotonic() - since)

    def sent_back(self, order: int | None) -> TypeGuard[int]:
        return order is not None and order in self._orders

    async def in_turn(self, order: int, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call` (the ACQUIRE of a request sent back) after those that came back before."""
        try:
            async with self.gate:
                return await call()
        finally:
            self._orders.discard(order)
