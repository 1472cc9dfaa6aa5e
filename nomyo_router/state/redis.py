"""`RedisStore`: state shared by router instances on several hosts, kept in Redis.

- Acquire, release, cancel and health changes are atomic Lua scripts (redis_scripts.py); a
  request's grant or place in the queue every instance shares: redis_queue.py.
- Every Redis call has a deadline, `redis_timeout` (redis_link.py): a Redis that stalls is an
  outage exactly like a Redis that is dead, with the same fallback and the same recovery.
- Slot leases expire after `lease_ttl`; each instance extends the leases it holds every
  min(1 s, `lease_ttl / 3`), so a process killed with SIGKILL leaks its slots for at most
  `lease_ttl`. Lease and waiter ids name their instance, and the same sweep reconciles Redis
  with what the instance really holds (redis_reconcile.py).
- Waiters sleep on a future, woken through pub/sub when a slot is handed to them; no
  polling. The same periodic sweep hands on slots freed by expiry.
- If Redis becomes unreachable or stalls, the instance logs loudly, counts it (`/health`),
  and keeps serving from its own table (redis_local.py: one table for all its workers, its
  share of each endpoint's slots by the instances Redis last knew of), which also counts the
  leases the instance already holds; waiters queued in Redis move to it at once. A probe
  every second switches back when Redis answers again: it re-registers the slot table (a
  restarted Redis has lost it), subscribes afresh, reconciles, and the requests still
  waiting locally then queue in Redis again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from redis.exceptions import RedisError

from ..config import SUPERVISOR_ENV, RouterConfig
from ..domain import Endpoint
from .base import Ask, Changes, Choose, Lease, StateStore
from .key_limits import Limits, Verdict
from .queue_order import Fair
from .redis_check import RedisMisconfigured, misconfiguration
from .redis_limits import RedisLimits
from .redis_link import RedisLink, end
from .redis_local import LocalTable, ProcessTable, wait_locally
from .redis_messages import Messages
from .redis_pins import RedisPins
from .redis_queue import RedisLost, RedisWaitQueue
from .redis_reconcile import Ledger, as_str
from .redis_rehome import Rehoming
from .redis_url import address
from .redis_usage import UsageBatches

log = logging.getLogger("nomyo_router.redis")

RETRY_S = 1.0


class RedisStore(StateStore):
    def __init__(
        self, url: str, endpoints: Sequence[Endpoint], config: RouterConfig, local: LocalTable | None = None
    ) -> None:
        """`local`: where this instance's limits are kept while Redis is away: the table its
        workers share (`HostTable`), or by default this process's own (`ProcessTable`)."""
        self.url = url
        self.endpoints = {e.name: e for e in endpoints}
        self.config = config
        tag = hashlib.blake2b(",".join(sorted(self.endpoints)).encode(), digest_size=4).hexdigest()
        self.prefix = f"nomyo:{tag}"
        self.owner = uuid.uuid4().hex[:12]
        self.lease_ms = int(config.lease_ttl * 1000)
        self.link = RedisLink(url, config.redis_timeout, self.prefix, self.lease_ms)
        supervisor = os.environ.get(SUPERVISOR_ENV)  # (the workers of one supervisor: one instance)
        self.ledger = Ledger(self.owner, f"{socket.gethostname()}:{supervisor}" if supervisor else self.owner)
        # Counts every lease of this instance, whichever store granted it: while Redis is away
        # its limits are the instance's, and those include the leases Redis granted before.
        self.local: LocalTable = local or ProcessTable(config.max_queue, config.affinity_ttl, config.affinity_max_pins)
        self.degraded = False
        self.degraded_events = 0
        self._back = asyncio.Event()  # set when Redis answers again; a new one per outage
        self._unhealthy: set[str] = set()
        self._unsent_health: set[str] = set()  # verdicts Redis missed (it was away)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self.messages = Messages(self.link, self.ledger, self._is_degraded, self._degrade, self._background)
        self.pins = RedisPins(self.link, config.affinity_ttl, self.local, self._is_degraded, self._degrade)
        self.usage = UsageBatches(self.owner)
        self.rehoming = Rehoming()
        self.limits = RedisLimits(self.link, self.local, self._is_degraded, self._degrade, self._background)
        self.queue = RedisWaitQueue(
            self.link, self.ledger, self.rehoming, config.max_queue, self._is_degraded, self._degrade, self._background
        )

    # ---- life cycle -----------------------------------------------------------
    async def start(self) -> None:
        await self.local.start()  # (workers: elect the host of their shared table)
        try:
            await self._register()
            await self.messages.listen()
        except (RedisError, OSError) as e:
            reason = misconfiguration(e, self.url)
            if reason is not None:  # not an outage: it will not pass by itself
                await self.link.close()
                raise RedisMisconfigured(f"state: Redis at {address(self.url)}: {reason}") from None
            self._degrade(e)
        self._loops = [asyncio.create_task(self._sweep_loop())]

    async def _register(self) -> None:
        await self.link.call(
            self.link.client.hset(f"{self.prefix}:slots", mapping={n: e.slots for n, e in self.endpoints.items()})
        )

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints.update((e.name, e) for e in endpoints)
        self._background(self._reregister())  # new slot counts; the next sweep hands freed ones on
        self.local.update_endpoints(endpoints)

    async def _reregister(self) -> None:
        try:
            async with self.rehoming.gate:  # before the requests a reload sends back ask again
                await self._register()
        except (RedisError, OSError) as e:
            self._degrade(e)

    def rehome(self, changes: Changes) -> None:
        self.local.rehome(changes)  # (those waiting locally: Redis is away)
        self.rehoming.wake(changes.keys(), self.ledger.waiting)

    async def close(self) -> None:
        for t in self._loops:
            await end(t)  # (a single cancel can be lost in redis-py: see `end`)
        await asyncio.gather(*self._tasks, self.messages.close(), return_exceptions=True)
        await self.link.close()
        await self.local.close()

    def _is_degraded(self) -> bool:
        return self.degraded

    def _degrade(self, error: BaseException) -> None:
        if not self.degraded:
            self.degraded = True
            self.degraded_events += 1
            self._back = asyncio.Event()
            n = self.ledger.instances
            log.error(
                "REDIS UNREACHABLE (%s: %s): serving with this instance's limits until it is back "
                "(%s of each endpoint's slots)",
                type(error).__name__,
                error,
                f"1/{n}, as {n} instances shared them" if n > 1 else "all",
            )
        # Nobody is stranded in a queue that does not answer: waiters move to the local queue now.
        for fut in self.ledger.waiting.values():
            if not fut.done():
                fut.set_result(None)

    async def _recover(self) -> None:
        """Redis answers again: share limits again, leaving nothing of the outage in it."""
        await self.link.reset()
        await self.link.call(self.link.client.ping())
        await self._register()
        unsent, self._unsent_health = self._unsent_health, set()
        try:
            for name in self._unhealthy | unsent:  # a restarted Redis knows none
                await self.link.run("HEALTH", name, 0 if name in self._unhealthy else 1)
        except BaseException:
            self._unsent_health |= unsent
            raise
        await self.messages.listen()  # before anyone queues there again
        ghosts = self.ledger.ghosts
        # The reconciliation, again while a slot was handed out locally meanwhile: Redis must
        # count every slot this process holds before it grants any (and no await between the
        # last check and switching over, so that no local grant slips in).
        for _ in range(5):
            await self._sweep()
            held = sum(self.local.own(ep) for ep in self.endpoints.values())
            if self.ledger.all_swept() and held == len(self.ledger.held):
                break
        self.degraded = False
        self._back.set()  # requests waiting locally queue in Redis again
        for name in self._unsent_health:  # changed while this ran
            self._background(self._health(name, name not in self._unhealthy))
        self._unsent_health.clear()
        log.error(
            "Redis is reachable again: limits are shared again (%d stale entries of the outage "
            "removed, %d leases of this instance registered)",
            self.ledger.ghosts - ghosts,
            len(self.ledger.held),
        )

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- slots ------------------------------------------------------------------
    async def acquire(self, ask: Ask) -> Lease:
        lease = await self._acquire(ask.model, ask.candidates, ask.choose, ask.timeout, ask.order, ask.fair)
        if ask.pin is not None:
            await self.set_pin(ask.pin, lease.endpoint.name)  # awaited: the next turn will see it
        return lease

    async def _acquire(
        self,
        model: str,
        candidates: Sequence[Endpoint],
        choose: Choose,
        timeout: float,
        order: int | None,
        fair: Fair | None = None,
    ) -> Lease:
        """In Redis while it answers, else locally; across an outage, a request moves from one
        to the other (and back) with what is left of its timeout."""
        t0 = time.monotonic()
        while True:
            left = max(timeout - (time.monotonic() - t0), 0.001)
            if self.degraded:
                lease = await self._acquire_local(model, candidates, choose, left, fair)
                if lease is None:
                    continue  # Redis is back: queue there
            else:
                try:
                    name, lid = await self.queue.acquire(model, candidates, left, order, fair)
                except RedisLost:
                    continue
                lease = self._hold_granted(name, lid)
            lease.queued_s = time.monotonic() - t0
            return lease

    def _hold_granted(self, name: str, lid: str) -> Lease:
        endpoint = self.endpoints[name]
        self.local.count(endpoint)  # counted locally too: the limit while Redis is away
        return self._hold(endpoint, lid)

    async def _acquire_local(
        self, model: str, candidates: Sequence[Endpoint], choose: Choose, timeout: float, fair: Fair | None = None
    ) -> Lease | None:
        """The local queue while Redis is away; None if Redis answers again first (the
        request then queues there, so that one queue orders everyone again)."""
        local = await wait_locally(self.local, self._back, model, candidates, choose, timeout, fair)
        if local is None:
            return None
        if not self.degraded:  # handed out after Redis came back, which alone grants now
            local.release()
            return None
        # Already counted in the local store; Redis learns of it with the next sweep.
        return self._hold(local.endpoint, self.ledger.new_id())

    def _hold(self, endpoint: Endpoint, lid: str) -> Lease:
        self.ledger.held[lid] = endpoint.name
        return Lease(self, endpoint, token=lid)

    def release(self, endpoint: Endpoint, token: object = None) -> None:
        if not isinstance(token, str):  # (its lease id, always)
            return
        name = self.ledger.held.pop(token, None)
        if name is None:
            return
        self.local.release(endpoint)  # and a request waiting locally gets the slot
        self.ledger.released(name)
        if not self.ledger.defer(name, token) and not self.degraded:
            self._background(self._release(name, token))

    async def _release(self, name: str, lid: str) -> None:
        try:
            await self.link.run("RELEASE", name, lid)
        except (RedisError, OSError) as e:
            self._degrade(e)  # the reconciliation removes the lease

    # ---- background -----------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        """Sweep (extend, reconcile, hand on expired leases); while degraded, try to recover."""
        while True:
            # At least every second: a sweep is one cheap script call, and it is also how a
            # stall is noticed when no request is talking to Redis.
            await asyncio.sleep(min(RETRY_S, max(self.config.lease_ttl / 3, 0.05)))
            try:
                if self.degraded:
                    await self._recover()
                    continue
                await self._sweep()
                await self.usage.flush(self.link)
            except (RedisError, OSError) as e:
                self._degrade(e)
            except Exception:  # a bug here must not end sweeping for good
                log.exception("Redis sweep failed")

    async def _sweep(self) -> None:
        res = None
        try:
            res = await self.link.run_list("SWEEP", *self.ledger.sweep_args())
        finally:  # releases it held back: sent if it was answered (the reconciliation too)
            for name, lid in self.ledger.swept(res):
                self._background(self._release(name, lid))
        self.local.share_by(self.ledger.instances)  # this instance's share if Redis goes away

    def publish(self, topic: str, data: object) -> None:
        self.messages.publish(topic, data)

    def subscribe(self, topic: str, callback: Callable[[object], None]) -> None:
        self.messages.subscribe(topic, callback)

    def record(self, endpoint: str, model: str) -> None:
        self.usage.record(endpoint, model)  # sent with the next sweep, in one script call

    # ---- views, health, pins ----------------------------------------------------------
    async def admit(self, client: str, limits: Limits, count: bool = True, reserve: int = 0) -> Verdict:
        return await self.limits.admit(client, limits, count, reserve)

    def spend(self, client: str, tokens: int, limits: Limits, hold: int = 0, reserved: int = 0) -> None:
        self.limits.spend(client, tokens, limits, hold, reserved)

    def in_flight(self, endpoint: Endpoint) -> int:
        """Over all instances, as the last grant or sweep (at most a second ago) reported it,
        and never less than this process holds. No round trip: the gauges read it."""
        own = self.local.in_flight(endpoint)
        return own if self.degraded else max(own, self.ledger.shared.get(endpoint.name, 0))

    def queue_length(self) -> int:
        """Requests waiting over all instances, as of the last sweep; this process's own exactly."""
        own = self.local.queue_length() + self.ledger.queued
        return own if self.degraded else max(own, self.ledger.shared_queue)

    async def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "mode": "redis",
            "degraded": self.degraded,
            "degraded_events": self.degraded_events,
            "instances": self.ledger.instances,
        }
        if self.degraded:
            local = await self.local.snapshot()
            return {**snap, "in_flight": local["in_flight"], "queue_length": local["queue_length"]}
        try:
            now_ms = int(time.time() * 1000)
            pipe = self.link.client.pipeline()
            for name in self.endpoints:
                pipe.zcount(f"{self.prefix}:lease:{name}", now_ms, "+inf")
            pipe.zcard(f"{self.prefix}:queue")
            for name in self.endpoints:
                pipe.hgetall(f"{self.prefix}:usage:{name}")
            res = await self.link.call(pipe.execute())
        except (RedisError, OSError) as e:
            self._degrade(e)
            return {**snap, "degraded": True, "in_flight": {}, "queue_length": 0}
        n = len(self.endpoints)
        usage: dict[str, dict[str, int]] = {}
        for name, counts in zip(self.endpoints, res[n + 1 :], strict=True):
            usage[name] = {as_str(k): int(v) for k, v in counts.items()}
        for (ep, model), c in self.usage.pending().items():  # not counted in Redis yet
            usage.setdefault(ep, {})[model] = usage.get(ep, {}).get(model, 0) + c
        return {
            **snap,
            "in_flight": dict(zip(self.endpoints, res[:n], strict=True)),
            "queue_length": res[n],
            "usage": usage,
        }

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        self.local.set_healthy(endpoint, healthy)
        if healthy == (endpoint.name not in self._unhealthy):
            return
        (self._unhealthy.discard if healthy else self._unhealthy.add)(endpoint.name)
        if self.degraded:
            self._unsent_health.add(endpoint.name)  # a stalled Redis still has the old verdict
        else:
            self._background(self._health(endpoint.name, healthy))

    async def _health(self, name: str, healthy: bool) -> None:
        try:
            await self.link.run("HEALTH", name, 1 if healthy else 0)
        except (RedisError, OSError) as e:
            self._unsent_health.add(name)
            self._degrade(e)

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        return await self.pins.find(keys)

    async def set_pin(self, key: str, endpoint: str) -> None:
        await self.pins.set(key, endpoint)

    async def drop_pin(self, key: str) -> None:
        await self.pins.drop(key)
