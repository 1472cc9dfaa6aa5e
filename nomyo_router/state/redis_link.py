"""`RedisLink`: RedisStore's connection to Redis, where every call has a deadline.

A Redis that stalls (`DEBUG SLEEP`, a long script, a network partition that sends no RST)
keeps its sockets open and answers nothing. Without a deadline each call would wait for the
socket timeout, and the retry after it, while requests queue behind it. So every call here
either answers within `redis_timeout` or fails with `RedisTimeout`, which is a `RedisError`
like any other: the store degrades exactly as when Redis is dead, and recovers the same way.

Only a refused or reset connection is retried once (on a fresh connection: a pooled one may
have died with an earlier server). A timeout is not: the command may still run later, and the
store's reconciliation (redis_reconcile.py) cleans up what it leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Protocol, TypeVar

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..task_stop import end as end
from . import redis_scripts as lua
from . import redis_url

T = TypeVar("T")
# What a Lua script is passed (redis-py encodes each), and what it answers: a Lua table
# of strings and numbers comes back as a list of bytes and ints.
Arg = str | int | float | bytes
Reply = int | bytes | list[int | bytes] | None


class Subscription(Protocol):
    """A pub/sub connection (redis-py's PubSub), as the store reads and closes it."""

    def listen(self) -> AsyncIterator[Mapping[str, object]]: ...

    async def aclose(self) -> None: ...


class RedisTimeout(RedisTimeoutError):
    """Redis did not answer within `redis_timeout`: to the store, an outage."""


class RedisLink:
    def __init__(self, url: str, timeout: float, prefix: str, lease_ms: int) -> None:
        self.timeout = timeout
        self.prefix = prefix
        self.lease_ms = lease_ms
        # socket timeouts too, so that redis-py itself drops a connection that went silent
        self.client = redis_url.client(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
        self._scripts = {name: self.client.register_script(getattr(lua, name)) for name in lua.NAMES}

    async def call(self, op: Awaitable[T]) -> T:
        """`op` (a command, a pipeline, a few commands in one coroutine) within the deadline."""
        try:
            async with asyncio.timeout(self.timeout):
                return await op
        except TimeoutError:
            raise RedisTimeout(f"no answer within redis_timeout ({self.timeout:g}s)") from None

    async def run(self, name: str, *args: Arg) -> Reply:
        """One of the Lua scripts (redis_scripts.py), with the prefix and lease time first."""
        reply: Reply = await self.call(self._scripts[name](args=[self.prefix, self.lease_ms, *args]))
        return reply

    async def run_list(self, name: str, *args: Arg) -> list[int | bytes]:
        """`run` for a script that answers a table: its items (RedisError if it did not)."""
        reply = await self.run(name, *args)
        if not isinstance(reply, list):
            raise RedisError(f"{name} answered {reply!r}, not a table")
        return reply

    async def subscribe(self, *channels: str) -> Subscription:
        """A pub/sub connection subscribed to `channels` (reading from it has no deadline:
        it is quiet when nothing happens; the store replaces it after every outage)."""
        pubsub = self.client.pubsub()
        try:
            await self.call(pubsub.subscribe(*channels))
        except BaseException:
            await self.close_pubsub(pubsub)
            raise
        return pubsub

    async def close_pubsub(self, pubsub: Subscription) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout):
                await pubsub.aclose()

    async def reset(self) -> None:
        """Drop every pooled connection: after an outage they lead to a stalled or dead
        server, and commands still waiting on them fail now rather than later."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout):
                await self.client.connection_pool.disconnect()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.timeout):
                await redis_url.close(self.client)
