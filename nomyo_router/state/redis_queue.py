"""A slot from Redis: RedisStore's ACQUIRE, and the wait in the shared queue.

One script call grants a slot at once (on the free candidate the script picks: a loaded model
first, ties to a random endpoint), refuses (no healthy endpoint, the queue is full), or places
the request in the queue shared by every instance, ordered by its fair share. A queued request
sleeps on a future that the pub/sub reader (redis_messages.py) completes with the endpoint it is
handed, with REHOME when the endpoints changed (redis_rehome.py), or with None when Redis went
away: then it waits in the process's own store (`RedisLost`), and Redis' entry for it is
reconciled away (redis_reconcile.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence

from redis.exceptions import RedisError

from ..domain import Endpoint
from .base import NoEndpoint, QueueFull, QueueTimeout
from .queue_order import DEFAULT as DEFAULT_FAIR
from .queue_order import Fair
from .redis_link import Arg, RedisLink
from .redis_reconcile import Ledger, as_str
from .redis_rehome import REHOME, Rehoming


class RedisLost(Exception):
    """Redis failed or stalled during an acquire: the request waits locally instead."""


class RedisWaitQueue:
    def __init__(
        self,
        link: RedisLink,
        ledger: Ledger,
        rehoming: Rehoming,
        max_queue: int,
        degraded: Callable[[], bool],
        degrade: Callable[[BaseException], None],
        background: Callable[[Coroutine[object, object, None]], None],
    ) -> None:
        self.link, self.ledger, self.rehoming, self.max_queue = link, ledger, rehoming, max_queue
        self._degraded, self._degrade, self._background = degraded, degrade, background

    async def acquire(
        self, model: str, candidates: Sequence[Endpoint], timeout: float, order: int | None, fair: Fair | None = None
    ) -> tuple[str, str]:
        """(the endpoint granted, the lease id). Raises NoEndpoint, QueueFull, QueueTimeout,
        Rehome (sent back by a change of endpoints) and RedisLost."""
        ledger = self.ledger
        lid = ledger.new_id()
        shuffled = list(candidates)
        random.shuffle(shuffled)  # ties go to a random endpoint, never always the first
        args: list[Arg] = [
            lid,
            self.max_queue,
            ledger.owner,
            "" if order is None else order,
            int((timeout + 5) * 1000),
            *(fair or DEFAULT_FAIR),
        ]
        for e in shuffled:
            args += [e.name, 1 if model in e.loaded else 0]
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        ledger.waiting[lid] = fut  # before the script: the wake-up may beat its reply
        try:
            try:
                if self.rehoming.sent_back(order):  # placed again after a reload: oldest first
                    res = await self.rehoming.in_turn(order, lambda: self.link.run_list("ACQUIRE", *args))
                else:
                    res = await self.link.run_list("ACQUIRE", *args)
            except (RedisError, OSError) as e:
                self._degrade(e)
                raise RedisLost from None  # if it ran after all, the reconciliation undoes it
            kind = as_str(res[0])
            if kind == "ok":
                name = as_str(res[1])
                ledger.granted(name, res[2:])
                return name, lid
            if kind == "none":
                raise NoEndpoint(model)
            if kind == "full":
                raise QueueFull(model)
            queued_order = int(as_str(res[1]))
            ledger.enqueued()
            self.rehoming.queued(lid, model, queued_order)
            try:
                async with asyncio.timeout(timeout):
                    ep = await fut
                    if ep is REHOME:  # the endpoints changed: the scheduler places it again
                        raise self.rehoming.signal(lid)
            except BaseException as exc:
                if not self._degraded():
                    self._background(self.cancel(lid))  # gives the slot back if it came too late
                if isinstance(exc, TimeoutError):
                    raise QueueTimeout(model, queued_order) from None
                raise
            finally:
                ledger.dequeued()
                self.rehoming.left(lid)
            if ep is None:
                raise RedisLost  # Redis went away while we waited; the entry is reconciled away
            ledger.granted(ep)
            return ep, lid
        finally:
            ledger.waiting.pop(lid, None)

    async def cancel(self, lid: str) -> None:
        """Take `lid` out of the queue, or give back the slot it was handed meanwhile."""
        try:
            await self.link.run("CANCEL", lid)
        except (RedisError, OSError) as e:
            self._degrade(e)  # the reconciliation removes the entry
