"""Pub/sub for RedisStore: wake-ups for this instance's waiters, and the topics the routing
layer publishes to every instance (`StateStore.publish`).

Reading a subscription has no deadline — it is quiet whenever nothing happens — so a stalled
or partitioned Redis is noticed by the store's other calls, never here. The store therefore
replaces the subscription after every outage (`listen`): the old connection may hang on a
dead server forever, and a wake-up sent to it would be lost.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from .redis_link import RedisLink, Subscription, end
from .redis_reconcile import Ledger, as_str


class Messages:
    def __init__(
        self,
        link: RedisLink,
        ledger: Ledger,
        degraded: Callable[[], bool],
        degrade: Callable[[BaseException], None],
        background: Callable[[Coroutine[object, object, None]], None],
    ) -> None:
        self.link = link
        self.ledger = ledger
        self.wake = f"{link.prefix}:wake:{ledger.owner}"
        self.shared = f"{link.prefix}:pub"
        self._degraded = degraded
        self._degrade = degrade
        self._background = background
        self._subs: dict[str, Callable[[object], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._pubsub: Subscription | None = None

    async def listen(self) -> None:
        """A fresh subscription, in place before this returns (so no wake-up can be missed)."""
        await self.close()
        pubsub = await self.link.subscribe(self.wake, self.shared)
        self._task, self._pubsub = asyncio.create_task(self._read(pubsub)), pubsub

    async def close(self) -> None:
        """Ends the reader. The store's recovery waits here, right after `link.reset` dropped the
        reader's connection, so the reader is often resubscribing then, where redis-py can drop
        a cancel (`end`): it is cancelled until it has ended, and its subscription closed here
        too (a second cancel may cut its own closing short)."""
        task, pubsub, self._task, self._pubsub = self._task, self._pubsub, None, None
        if task is not None:
            await end(task)
        if pubsub is not None:
            await self.link.close_pubsub(pubsub)

    async def _read(self, pubsub: Subscription) -> None:
        try:
            async for msg in pubsub.listen():
                if msg.get("type") != "message":
                    continue
                if as_str(msg["channel"]) == self.shared:
                    self._published(msg["data"])
                    continue
                lid, _, ep = as_str(msg["data"]).partition(" ")
                fut = self.ledger.waiting.get(lid)
                if fut is not None and not fut.done():
                    fut.set_result(ep)
        except (RedisError, OSError) as e:
            self._degrade(e)
        finally:
            await self.link.close_pubsub(pubsub)

    def publish(self, topic: str, data: object) -> None:
        if not self._degraded() and topic in self._subs:
            self._background(self._publish(json.dumps([self.ledger.owner, topic, data])))

    async def _publish(self, payload: str) -> None:
        try:
            await self.link.call(self.link.client.publish(self.shared, payload))
        except (RedisError, OSError) as e:
            self._degrade(e)

    def subscribe(self, topic: str, callback: Callable[[object], None]) -> None:
        self._subs[topic] = callback

    def _published(self, raw: Any) -> None:
        try:
            owner, topic, data = json.loads(raw)
        except (ValueError, TypeError):
            return
        cb = self._subs.get(topic)
        if owner != self.ledger.owner and cb is not None:
            cb(data)
