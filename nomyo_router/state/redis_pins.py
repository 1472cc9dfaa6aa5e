"""Affinity pins for RedisStore: in Redis for every instance, and in this process too.

Every pin written goes to the local store as well, so that while Redis is away (dead or
stalled) the conversations this instance has seen keep their endpoints; a pin lookup that
Redis does not answer within `redis_timeout` is an outage like any other call, and the
local pins answer it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from .base import StateStore
from .redis_link import RedisLink
from .redis_reconcile import as_str


class RedisPins:
    def __init__(
        self,
        link: RedisLink,
        ttl: float,
        local: StateStore,
        degraded: Callable[[], bool],
        degrade: Callable[[BaseException], None],
    ) -> None:
        self.link = link
        self.ttl_ms = int(ttl * 1000)
        self.local = local
        self._degraded = degraded
        self._degrade = degrade

    def _key(self, key: str) -> str:
        return f"{self.link.prefix}:pin:{key}"

    async def find(self, keys: Sequence[str]) -> tuple[str, str] | None:
        if self._degraded() or not keys:
            return await self.local.find_pin(keys)
        try:
            return await self.link.call(self._find(keys))  # one deadline for both round trips
        except (RedisError, OSError) as e:
            self._degrade(e)
            return await self.local.find_pin(keys)

    async def _find(self, keys: Sequence[str]) -> tuple[str, str] | None:
        client = self.link.client
        values = await client.mget([self._key(k) for k in keys])
        for key, value in zip(keys, values, strict=True):
            if value is not None:
                await client.pexpire(self._key(key), self.ttl_ms)
                return key, as_str(value)
        return None

    async def set(self, key: str, endpoint: str) -> None:
        await self.local.set_pin(key, endpoint)  # also valid if Redis goes away later
        if not self._degraded():
            try:
                await self.link.call(self.link.client.set(self._key(key), endpoint, px=self.ttl_ms))
            except (RedisError, OSError) as e:
                self._degrade(e)

    async def drop(self, key: str) -> None:
        await self.local.drop_pin(key)
        if not self._degraded():
            try:
                await self.link.call(self.link.client.delete(self._key(key)))
            except (RedisError, OSError) as e:
                self._degrade(e)
