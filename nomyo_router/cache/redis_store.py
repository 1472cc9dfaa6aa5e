"""Kept answers in Redis, shared by every router instance that points at it.

- `<prefix>:rcache:e:<key>`: the entry (namespace and value, msgpack), expiring after `ttl`;
- `<prefix>:rcache:idx`: a sorted set of keys by when they were stored, which bounds the
  count to `max_entries` (the oldest go first) and lists the entries for stats and clear;
- `<prefix>:rcache:vec`: a stream of (key, namespace, vector) for semantic mode, capped near
  `max_entries`; each instance reads what is new since its last look (store.py);
- `<prefix>:rcache:stats`: every instance's hits and misses, added once a second.

An entry is stored as soon as its answer is complete, so another instance's next lookup
finds it. Every call has the `redis_timeout` deadline; a failure is a miss (service.py).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ..config import CacheConfig
from ..state import redis_url
from .stores import AnswerStore, Cursor, Vectors


class RedisAnswerStore(AnswerStore):
    def __init__(self, cfg: CacheConfig, url: str, timeout: float, prefix: str = "nomyo") -> None:
        self.url, self.timeout, self.ttl, self.max_entries = url, timeout, cfg.ttl, cfg.max_entries
        self.p = f"{prefix}:rcache:"
        self._redis: Any = None

    async def start(self) -> None:
        self._redis = redis_url.client(self.url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout)

    async def close(self) -> None:
        if self._redis is not None:
            await redis_url.close(self._redis)

    async def get(self, key: str) -> bytes | None:
        data = await self._redis.get(self.p + "e:" + key)
        return None if data is None else msgspec.msgpack.decode(data)[1]

    async def put(self, key: str, ns: str, value: bytes, vector: bytes | None = None) -> None:
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self.p + "e:" + key, msgspec.msgpack.encode((ns, value)), px=int(self.ttl * 1000))
        pipe.zadd(self.p + "idx", {key: now})
        pipe.zremrangebyscore(self.p + "idx", "-inf", now - self.ttl)  # expired by Redis already
        if vector is not None:
            pipe.xadd(self.p + "vec", {"k": key, "n": ns, "v": vector}, maxlen=self.max_entries, approximate=True)
        pipe.zcard(self.p + "idx")
        n = (await pipe.execute())[-1]
        if n > self.max_entries:
            gone = [k for k, _ in await self._redis.zpopmin(self.p + "idx", n - self.max_entries)]
            if gone:
                await self._redis.delete(*(self.p.encode() + b"e:" + k for k in gone))

    async def vectors(self, cursor: Cursor) -> tuple[Vectors, Cursor]:
        rows = await self._redis.xrange(self.p + "vec", min=f"({cursor}" if cursor else "-", count=10_000)
        out = [(f[b"k"].decode(), f[b"n"].decode(), f[b"v"]) for _, f in rows]
        return out, (rows[-1][0].decode() if rows else cursor)

    async def size(self) -> tuple[int, int]:
        await self._redis.zremrangebyscore(self.p + "idx", "-inf", time.time() - self.ttl)
        keys = await self._redis.zrange(self.p + "idx", 0, -1)
        pipe = self._redis.pipeline(transaction=False)
        for k in keys:
            pipe.strlen(self.p.encode() + b"e:" + k)
        sizes = await pipe.execute() if keys else []
        return sum(1 for s in sizes if s), sum(sizes)

    async def clear(self) -> int:
        keys = await self._redis.zrange(self.p + "idx", 0, -1)
        n = 0
        for i in range(0, len(keys), 500):
            n += await self._redis.delete(*(self.p.encode() + b"e:" + k for k in keys[i : i + 500]))
        await self._redis.delete(self.p + "idx", self.p + "vec")
        return n

    async def add_counts(self, hits: int, misses: int) -> None:
        pipe = self._redis.pipeline(transaction=False)
        pipe.hincrby(self.p + "stats", "hits", hits)
        pipe.hincrby(self.p + "stats", "misses", misses)
        await pipe.execute()

    async def counts(self) -> tuple[int, int]:
        hits, misses = await self._redis.hmget(self.p + "stats", "hits", "misses")
        return int(hits or 0), int(misses or 0)
