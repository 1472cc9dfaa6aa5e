"""`RedisStore`: state shared by router instances on several hosts, kept in Redis.

- Acquire, release, cancel and health changes are atomic Lua scripts (redis_scripts.py).
- Slot leases expire after `lease_ttl`; each instance extends the leases it holds every
  min(1 s, `lease_ttl / 3`), so a process killed with SIGKILL leaks its slots for at most
  `lease_ttl`.
- Waiters sleep on a future, woken through pub/sub when a slot is handed to them; no
  polling. The same periodic sweep that extends leases hands on slots freed by expiry.
- If Redis becomes unreachable, the instance logs loudly, counts it (`/health`), and keeps
  serving from a per-process MemoryStore; a probe every second switches back when Redis
  answers again (and re-registers the slot table, which a restarted Redis has lost).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
import uuid
from collections import Counter
from typing import Any, Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from ..config import RouterConfig
from ..domain import Endpoint
from ..routing.policies import Policy
from . import redis_scripts as lua
from .base import Choose, Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore
from .memory import MemoryStore

log = logging.getLogger("nomyo_router.redis")

RETRY_S = 1.0



class _RedisLost(Exception):
    """Set on waiters' futures when Redis becomes unreachable: wait locally instead."""

class RedisStore(StateStore):
    def __init__(self, url: str, endpoints: Sequence[Endpoint], config: RouterConfig, policy: Policy) -> None:
        self.url = url
        self.endpoints = {e.name: e for e in endpoints}
        self.config = config
        tag = hashlib.blake2b(",".join(sorted(self.endpoints)).encode(), digest_size=4).hexdigest()
        self.prefix = f"nomyo:{tag}"
        self.owner = uuid.uuid4().hex[:12]
        self.lease_ms = int(config.lease_ttl * 1000)
        self.local = MemoryStore(config.max_queue, config.affinity_ttl, config.affinity_max_pins)
        self.degraded = False
        self.degraded_events = 0
        # One quick retry on a fresh connection hides a pooled connection that died with an
        # earlier server; anything longer is an outage and degrades.
        self._redis = aioredis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0,
                                        retry=Retry(NoBackoff(), 1),
                                        retry_on_error=[RedisConnectionError])
        self._scripts: dict[str, Any] = {}
        self._waiters: dict[str, asyncio.Future] = {}
        self._active: dict[str, str] = {}  # lease id -> endpoint, for lease extension
        self._unhealthy: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._usage: Counter[tuple[str, str]] = Counter()  # not yet flushed to Redis
        self._loops: list[asyncio.Task] = []
        self._subs: dict[str, Callable[[Any], None]] = {}
        self._global: dict[str, int] = {}  # in flight over all instances, as of our last grant

    # ---- life cycle -----------------------------------------------------------
    async def start(self) -> None:
        for name in ("ACQUIRE", "RELEASE", "CANCEL", "SWEEP", "HEALTH"):
            self._scripts[name] = self._redis.register_script(getattr(lua, name))
        try:
            await self._register()
        except (RedisError, OSError) as e:
            self._degrade(e)
        self._loops = [asyncio.create_task(self._sweep_loop()), asyncio.create_task(self._wake_loop())]

    async def _register(self) -> None:
        await self._redis.hset(f"{self.prefix}:slots", mapping={n: e.slots for n, e in self.endpoints.items()})

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints.update((e.name, e) for e in endpoints)
        self._background(self._reregister())  # new slot counts; the next sweep hands freed ones on
        self.local.update_endpoints(endpoints)

    async def _reregister(self) -> None:
        try:
            await self._register()
        except (RedisError, OSError) as e:
            self._degrade(e)

    async def close(self) -> None:
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
        await self._redis.aclose()

    def _degrade(self, error: BaseException) -> None:
        if not self.degraded:
            self.degraded = True
            self.degraded_events += 1
            log.error("REDIS UNREACHABLE (%s: %s): serving with per-process limits until it is back",
                      type(error).__name__, error)
        # Nobody is stranded in a queue that is gone: waiters move to the local queue now.
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(_RedisLost())

    async def _run(self, name: str, *args: Any) -> Any:
        return await self._scripts[name](args=[self.prefix, self.lease_ms, *args])

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- slots ------------------------------------------------------------------
    async def acquire(self, model: str, candidates: Sequence[Endpoint], choose: Choose,
                      timeout: float, order: int | None = None, pin: str | None = None) -> Lease:
        lease = await self._acquire(model, candidates, choose, timeout, order)
        if pin is not None:
            await self.set_pin(pin, lease.endpoint.name)  # awaited: the next turn will see it
        return lease

    async def _acquire(self, model: str, candidates: Sequence[Endpoint], choose: Choose,
                       timeout: float, order: int | None) -> Lease:
        if self.degraded:
            return await self.local.acquire(model, candidates, choose, timeout)
        lid = uuid.uuid4().hex
        shuffled = list(candidates)
        random.shuffle(shuffled)  # ties go to a random endpoint, never always the first
        args: list[Any] = [lid, self.config.max_queue, self.owner, "" if order is None else order,
                           int((timeout + 5) * 1000)]
        for e in shuffled:
            args += [e.name, 1 if model in e.loaded else 0]
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters[lid] = fut  # before the script: the wake-up may beat its reply
        t0 = time.monotonic()
        try:
            try:
                res = await self._run("ACQUIRE", *args)
            except (RedisError, OSError) as e:
                self._degrade(e)
                return await self.local.acquire(model, candidates, choose, timeout)
            kind = _s(res[0])
            if kind == "ok":
                name = _s(res[1])
                for i in range(2, len(res) - 1, 2):  # every instance's in-flight, as of this grant
                    self._global[_s(res[i])] = int(res[i + 1])
                self._global[name] = self._global.get(name, 0) + 1
                return self._lease(name, lid, 0.0)
            if kind == "none":
                raise NoEndpoint(model)
            if kind == "full":
                raise QueueFull(model)
            queued_order = int(_s(res[1]))
            try:
                async with asyncio.timeout(timeout):
                    ep = await fut
            except _RedisLost:
                # Redis vanished while we waited: wait on in the local queue for what is left of
                # the timeout (the shared entry expires with the old server).
                waited = time.monotonic() - t0
                lease = await self.local.acquire(model, candidates, choose, max(timeout - waited, 0.001))
                lease.queued_s += waited
                return lease
            except BaseException as exc:
                self._background(self._cancel(lid))  # gives the slot back if it came too late
                if isinstance(exc, TimeoutError):
                    raise QueueTimeout(model, queued_order) from None
                raise
            return self._lease(ep, lid, time.monotonic() - t0)
        finally:
            self._waiters.pop(lid, None)

    def _lease(self, name: str, lid: str, queued_s: float) -> Lease:
        self._active[lid] = name
        lease = Lease(self, self.endpoints[name], queued_s)
        lease.token = lid
        return lease

    async def _cancel(self, lid: str) -> None:
        try:
            await self._run("CANCEL", lid)
        except (RedisError, OSError) as e:
            self._degrade(e)  # the waiter entry expires by itself

    def release(self, endpoint: Endpoint, token: Any = None) -> None:
        if token is None:  # a lease from the local fallback store
            self.local.release(endpoint)
            return
        self._active.pop(token, None)
        n = self._global.get(endpoint.name, 0)
        if n > 0:
            self._global[endpoint.name] = n - 1
        self._background(self._release(endpoint.name, token))

    async def _release(self, name: str, lid: str) -> None:
        try:
            await self._run("RELEASE", name, lid)
        except (RedisError, OSError) as e:
            self._degrade(e)  # the lease expires within lease_ttl

    # ---- background -----------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        """Extend our leases, hand on expired ones; while degraded, probe Redis instead."""
        while True:
            # At least every second: a sweep is one cheap script call, and it is also how a
            # degraded instance notices that Redis is back.
            await asyncio.sleep(min(RETRY_S, max(self.config.lease_ttl / 3, 0.05)))
            try:
                if self.degraded:
                    await self._redis.connection_pool.disconnect()  # drop connections to the old server
                    await self._redis.ping()
                    await self._register()
                    for name in self._unhealthy:
                        await self._run("HEALTH", name, 0)
                    self.degraded = False
                    log.error("Redis is reachable again: limits are shared again")
                    continue
                args: list[Any] = []
                for lid, name in list(self._active.items()):
                    args += [name, lid]
                await self._run("SWEEP", *args)
                await self._flush_usage()
            except (RedisError, OSError) as e:
                self._degrade(e)

    async def _wake_loop(self) -> None:
        """Pub/sub: wake local waiters when a slot is handed to them."""
        channel = f"{self.prefix}:wake:{self.owner}"
        shared = f"{self.prefix}:pub"
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(channel, shared)
                await self._recheck_waiters()
                async for msg in pubsub.listen():
                    if msg.get("type") != "message":
                        continue
                    if _s(msg["channel"]) == shared:
                        self._published(msg["data"])
                        continue
                    lid, _, ep = _s(msg["data"]).partition(" ")
                    fut = self._waiters.get(lid)
                    if fut is not None and not fut.done():
                        fut.set_result(ep)
            except (RedisError, OSError) as e:
                self._degrade(e)
                await asyncio.sleep(RETRY_S)
            finally:
                try:
                    await pubsub.aclose()
                except (RedisError, OSError):
                    pass

    async def _recheck_waiters(self) -> None:
        """After (re)subscribing, a wake-up may have been missed: look the grants up once."""
        for lid, fut in list(self._waiters.items()):
            ep = await self._redis.get(f"{self.prefix}:granted:{lid}")
            if ep is not None and not fut.done():
                fut.set_result(_s(ep))

    def publish(self, topic: str, data: Any) -> None:
        if not self.degraded and topic in self._subs:
            payload = json.dumps([self.owner, topic, data])
            self._background(self._publish(payload))

    async def _publish(self, payload: str) -> None:
        try:
            await self._redis.publish(f"{self.prefix}:pub", payload)
        except (RedisError, OSError) as e:
            self._degrade(e)

    def subscribe(self, topic: str, callback: Callable[[Any], None]) -> None:
        self._subs[topic] = callback

    def _published(self, raw: Any) -> None:
        try:
            owner, topic, data = json.loads(raw)
        except (ValueError, TypeError):
            return
        cb = self._subs.get(topic)
        if owner != self.owner and cb is not None:
            cb(data)

    def record(self, endpoint: str, model: str) -> None:
        self._usage[(endpoint, model)] += 1  # flushed with the next sweep, in one pipeline

    async def _flush_usage(self) -> None:
        if not self._usage:
            return
        pending, self._usage = self._usage, Counter()
        pipe = self._redis.pipeline(transaction=False)
        for (ep, model), n in pending.items():
            pipe.hincrby(f"{self.prefix}:usage:{ep}", model, n)
        try:
            await pipe.execute()
        except (RedisError, OSError):
            self._usage.update(pending)  # try again next time
            raise

    # ---- views, health, pins ----------------------------------------------------------
    def in_flight(self, endpoint: Endpoint) -> int:
        own = sum(1 for n in self._active.values() if n == endpoint.name) + self.local.in_flight(endpoint)
        return own if self.degraded else max(own, self._global.get(endpoint.name, 0))

    def queue_length(self) -> int:
        return sum(1 for f in self._waiters.values() if not f.done())

    async def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {"mode": "redis", "degraded": self.degraded,
                                "degraded_events": self.degraded_events}
        if self.degraded:
            local = await self.local.snapshot()
            return {**snap, "in_flight": local["in_flight"], "queue_length": local["queue_length"]}
        try:
            now_ms = int(time.time() * 1000)
            pipe = self._redis.pipeline()
            for name in self.endpoints:
                pipe.zcount(f"{self.prefix}:lease:{name}", now_ms, "+inf")
            pipe.zcard(f"{self.prefix}:queue")
            for name in self.endpoints:
                pipe.hgetall(f"{self.prefix}:usage:{name}")
            res = await pipe.execute()
        except (RedisError, OSError) as e:
            self._degrade(e)
            return {**snap, "degraded": True, "in_flight": {}, "queue_length": 0}
        n = len(self.endpoints)
        usage: dict[str, dict[str, int]] = {}
        for name, counts in zip(self.endpoints, res[n + 1:]):
            usage[name] = {_s(k): int(v) for k, v in counts.items()}
        for (ep, model), c in self._usage.items():  # not flushed yet
            usage.setdefault(ep, {})[model] = usage.get(ep, {}).get(model, 0) + c
        return {**snap, "in_flight": dict(zip(self.endpoints, res[:n])), "queue_length": res[n],
                "usage": usage}

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        self.local.set_healthy(endpoint, healthy)
        if healthy == (endpoint.name not in self._unhealthy):
            return
        (self._unhealthy.discard if healthy else self._unhealthy.add)(endpoint.name)
        if not self.degraded:
            self._background(self._health(endpoint.name, healthy))

    async def _health(self, name: str, healthy: bool) -> None:
        try:
            await self._run("HEALTH", name, 1 if healthy else 0)
        except (RedisError, OSError) as e:
            self._degrade(e)

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        if self.degraded or not keys:
            return await self.local.find_pin(keys)
        try:
            values = await self._redis.mget([f"{self.prefix}:pin:{k}" for k in keys])
            for key, value in zip(keys, values):
                if value is not None:
                    await self._redis.pexpire(f"{self.prefix}:pin:{key}", int(self.config.affinity_ttl * 1000))
                    return key, _s(value)
        except (RedisError, OSError) as e:
            self._degrade(e)
            return await self.local.find_pin(keys)
        return None

    async def set_pin(self, key: str, endpoint: str) -> None:
        await self.local.set_pin(key, endpoint)  # also valid if Redis goes away later
        if not self.degraded:
            try:
                await self._redis.set(f"{self.prefix}:pin:{key}", endpoint,
                                      px=int(self.config.affinity_ttl * 1000))
            except (RedisError, OSError) as e:
                self._degrade(e)

    async def drop_pin(self, key: str) -> None:
        await self.local.drop_pin(key)
        if not self.degraded:
            try:
                await self._redis.delete(f"{self.prefix}:pin:{key}")
            except (RedisError, OSError) as e:
                self._degrade(e)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
