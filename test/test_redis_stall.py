"""A Redis that stalls instead of dying — `DEBUG SLEEP`, or SIGSTOP (a partition without an
RST) — is an outage like a dead one: every call has a deadline (`redis_timeout`), requests
are served under the local limits meanwhile, and once Redis answers again no waiter or lease
left over from the stall remains in it. The gauges count what every instance holds."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest_asyncio
import redis.asyncio as aioredis

from mock import run_mock
from nomyo_router.config import parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.state.redis import RedisStore
from test.conftest import RedisServer
from test.helpers import endpoints, run_router
from test.test_metrics import value
from test.waits import Calls, until

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
SHORT = {**CHAT, "options": {"num_predict": 1}}
SERVICE = 0.15  # seconds each request holds its slot at the mock
REDIS_TIMEOUT = 1.0


async def router_keys(admin: aioredis.Redis, store: Any) -> dict[str, list[str]]:
    """The router's keys in Redis that say something is held or waits: {key: members}
    (members for the lease and queue sets). Empty sets and hashes vanish by themselves."""
    out: dict[str, list[str]] = {}
    for raw in await admin.keys(store.prefix + ":*"):
        key = raw.decode()
        kind = key[len(store.prefix) + 1 :].split(":", 1)[0]
        if kind in ("lease", "queue"):
            out[key] = sorted(m.decode() for m in await admin.zrange(key, 0, -1))
        elif kind in ("waiter", "granted", "own"):
            out[key] = []
    return out


async def metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url + "/metrics") as r:
        return await r.text()


class Load:
    """`clients` loops of one request after another; each records (start, end, status)."""

    def __init__(self, s: aiohttp.ClientSession, url: str, clients: int) -> None:
        self.done: list[tuple[float, float, int]] = []
        self._stop = asyncio.Event()

        async def client() -> None:
            while not self._stop.is_set():
                t0 = time.monotonic()
                async with s.post(url + "/api/chat", json=CHAT) as r:
                    await r.read()
                    self.done.append((t0, time.monotonic(), r.status))

        self._tasks = [asyncio.create_task(client()) for _ in range(clients)]

    async def stop(self) -> list[tuple[float, float, int]]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.done


async def _stall_under_load(stall: Callable[[RedisServer, aioredis.Redis], Awaitable[None]]) -> dict[str, Any]:
    """A router on a 2-slot backend under 6 looping clients; `stall` stalls Redis (and returns
    when it answers again). What happened, and what Redis and the gauges show afterwards with
    one stream in flight and then none."""
    with RedisServer() as redis:
        async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2, first_byte_delay_ms=SERVICE * 1000, parallel=64) as m:
            cfg = {
                "endpoints": endpoints(m, slots=2),
                "state": redis.url,
                "queue_timeout": 60,
                "redis_timeout": REDIS_TIMEOUT,
            }
            async with run_router(cfg) as r, aiohttp.ClientSession() as s:
                admin = aioredis.from_url(redis.url, socket_timeout=30)  # waits out the stall
                store = r.router.store
                sweeps = Calls(store, "_sweep")
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                    await resp.read()
                load = Load(s, r.url, 6)
                await asyncio.sleep(0.6)
                t_stall = time.monotonic()
                await stall(redis, admin)
                t_back = time.monotonic()
                recovered_after = await until(lambda: not store.degraded, 5.0)
                await asyncio.sleep(1.0)  # shared limits again, under load
                done = await load.stop()
                m.update(first_byte_delay_ms=0.0, tok_ms=50.0, tokens=400)  # one 20 s stream
                held = await s.post(r.url + "/api/chat", json={**CHAT, "stream": True})
                await held.content.readline()
                await sweeps.next()  # a sweep later
                keys_held = await router_keys(admin, store)
                text_held = await metrics(s, r.url)
                mock_held = m.stats()["in_flight"]
                held.close()
                await until(lambda: m.stats()["in_flight"] == 0, 3.0)
                await sweeps.next()
                keys_idle = await router_keys(admin, store)
                text_idle = await metrics(s, r.url)
                await admin.aclose()
                return {
                    "done": done,
                    "t_stall": t_stall,
                    "t_back": t_back,
                    "recovered_after": recovered_after,
                    "keys_held": keys_held,
                    "keys_idle": keys_idle,
                    "text_held": text_held,
                    "text_idle": text_idle,
                    "mock_held": mock_held,
                    "store": store,
                    "max_in_flight": m.stats()["max_in_flight"],
                }


def _check(out: dict[str, Any]) -> None:
    done, t_stall, t_back, store = out["done"], out["t_stall"], out["t_back"], out["store"]
    latencies = sorted(t1 - t0 for t0, t1, _ in done)
    print(
        f"\n{len(done)} requests, stall {t_back - t_stall:.1f} s, recovered {out['recovered_after']:.2f} s "
        f"after it, latency max {latencies[-1]:.2f} s p50 {latencies[len(latencies) // 2]:.2f} s, "
        f"stale entries removed {store.ledger.ghosts}"
    )
    assert {st for _, _, st in done} == {200}
    # nobody waited for queue_timeout (60 s), nor for the stall: the deadline, then local limits
    assert latencies[-1] < REDIS_TIMEOUT + 2.5, latencies[-5:]
    served_in_stall = [t1 for _, t1, _ in done if t_stall + REDIS_TIMEOUT + 1.0 < t1 < t_back - 0.3]
    assert len(served_in_stall) >= 5
    assert out["max_in_flight"] <= 2  # one instance: its own limits held throughout
    assert store.degraded_events == 1 and out["recovered_after"] < 3.5
    lease_key, own_key = f"{store.prefix}:lease:m0", f"{store.prefix}:own:{store.owner}"
    held = out["keys_held"]
    assert set(held) == {lease_key, own_key}, held  # no queue, waiter or granted entry left
    assert len(held[lease_key]) == 1 and held[lease_key][0].startswith(store.owner + ":")
    assert out["mock_held"] == 1 == value(out["text_held"], "nomyo_router_in_flight", endpoint="m0")
    assert value(out["text_held"], "nomyo_router_queued") == 0
    assert out["keys_idle"] == {}
    assert value(out["text_idle"], "nomyo_router_in_flight", endpoint="m0") == 0


async def _debug_sleep(redis: RedisServer, admin: aioredis.Redis) -> None:
    await admin.execute_command("DEBUG", "SLEEP", 5)


async def _sigstop(redis: RedisServer, admin: aioredis.Redis) -> None:
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(5)
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stalls() -> dict[str, Any]:
    """The stalls under load, the waiters caught in a stall and the verdict given during one,
    at once: each has its own Redis (and mock and router), and most of their time is spent
    waiting (for the stall, the deadline, a sweep), so together they take the time of the
    longest. Each test then checks its own outcome (or raises what its scenario raised, its
    own assertions among it)."""
    scenarios = {
        "debug_sleep": _stall_under_load(_debug_sleep),
        "sigstop": _stall_under_load(_sigstop),
        "waiters": _waiters_caught_in_a_stall(),
        "verdict": _a_verdict_and_usage_given_during_a_stall(),
    }
    outs = await asyncio.gather(*scenarios.values(), return_exceptions=True)
    return dict(zip(scenarios, outs, strict=True))


def _outcome(out: Any) -> Any:
    if isinstance(out, BaseException):
        raise out
    return out


def test_debug_sleep_is_an_outage_and_leaves_nothing_behind(stalls):
    _check(_outcome(stalls["debug_sleep"]))


def test_sigstop_is_a_partition_without_rst_and_sigcont_heals_it(stalls):
    _check(_outcome(stalls["sigstop"]))


def test_waiters_and_acquires_caught_in_a_stall_leave_no_ghosts(stalls):
    """One slot, held by a long stream; four requests queued in Redis when it stalls and two
    more sent into the stall. They wait locally (the slot is still held), queue in Redis again
    when it answers, and only they are in its queue: the entries of the stall are gone."""
    _outcome(stalls["waiters"])


async def _waiters_caught_in_a_stall() -> None:
    with RedisServer() as redis:
        async with run_mock(ttft_ms=0.0, tok_ms=50.0, tokens=400, parallel=64) as m:
            cfg = {
                "endpoints": endpoints(m, slots=1),
                "state": redis.url,
                "queue_timeout": 60,
                "redis_timeout": REDIS_TIMEOUT,
            }
            async with run_router(cfg) as r, aiohttp.ClientSession() as s:
                admin = aioredis.from_url(redis.url, socket_timeout=30)
                store = r.router.store
                sweeps = Calls(store, "_sweep")
                queue_key = f"{store.prefix}:queue"
                held = await s.post(r.url + "/api/chat", json={**CHAT, "stream": True})
                await held.content.readline()

                async def one() -> tuple[int, float]:
                    async with s.post(r.url + "/api/chat", json=SHORT) as resp:
                        await resp.read()
                        return resp.status, time.monotonic()

                waiting = [asyncio.create_task(one()) for _ in range(4)]
                await until(lambda: store.queue_length() == 4, 3.0)
                before = {x.decode() for x in await admin.zrange(queue_key, 0, -1)}
                sleeper = asyncio.create_task(admin.execute_command("DEBUG", "SLEEP", 3))
                await asyncio.sleep(0.3)
                waiting += [asyncio.create_task(one()) for _ in range(2)]  # their acquires hang
                await sleeper
                await until(lambda: not store.degraded, 5.0)
                await until(lambda: store.queue_length() == 6, 3.0)
                await sweeps.next()  # and a sweep later
                after = [x.decode() for x in await admin.zrange(queue_key, 0, -1)]
                waiting_ids = set(store.ledger.waiting)
                assert not any(t.done() for t in waiting)
                t_release = time.monotonic()
                held.close()
                results = await asyncio.gather(*waiting)
                await sweeps.next()
                keys_idle = await router_keys(admin, store)
                await admin.aclose()
    assert len(before) == 4 and len(after) == 6
    assert set(after) == waiting_ids and not set(after) & before
    assert store.ledger.ghosts >= 4  # the four queue entries of the stall (and any late acquire)
    assert [st for st, _ in results] == [200] * 6
    assert max(t for _, t in results) - t_release < 2.0
    assert keys_idle == {}


async def test_gauges_count_what_every_instance_holds(redis_url):
    async with run_mock(ttft_ms=0.0, tok_ms=50.0, tokens=400, parallel=64) as m:
        # (a deadline no busy machine reaches: an instance that counted Redis out would give
        # only its own numbers, and no outage is tested here)
        cfg = {"endpoints": endpoints(m, slots=2), "state": redis_url, "redis_timeout": 10.0}
        async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:
            sweeps = [Calls(r.router.store, "_sweep") for r in (r1, r2)]
            streams = [await s.post(r1.url + "/api/chat", json={**CHAT, "stream": True}) for _ in range(2)]
            for st in streams:
                await st.content.readline()
            waiter = asyncio.create_task(s.post(r1.url + "/api/chat", json=SHORT))
            await asyncio.gather(*(sw.next() for sw in sweeps))  # a sweep of each instance
            busy = [await metrics(s, r.url) for r in (r1, r2)]
            for st in streams:
                st.close()
            (await waiter).close()
            await asyncio.gather(*(sw.next() for sw in sweeps))
            idle = [await metrics(s, r.url) for r in (r1, r2)]
    for text in busy:
        assert value(text, "nomyo_router_in_flight", endpoint="m0") == 2
        assert value(text, "nomyo_router_queued") == 1
    for text in idle:
        assert value(text, "nomyo_router_in_flight", endpoint="m0") == 0
        assert value(text, "nomyo_router_queued") == 0


def test_a_health_verdict_and_usage_given_during_a_stall_reach_redis_once_after_it(stalls):
    """A stalled Redis, unlike a restarted one, still holds the verdict from before the stall:
    one given during it must be sent afterwards. A usage batch sent into the stall (which
    Redis may still run) is sent again and counted once."""
    _outcome(stalls["verdict"])


async def _a_verdict_and_usage_given_during_a_stall() -> None:
    with RedisServer() as redis:
        cfg = parse_config(
            {"endpoints": [{"url": "http://127.0.0.1:1", "name": "e", "max_concurrent": 1}], "state": redis.url}
        )
        ep = Endpoint.from_config(cfg.endpoints[0])
        store = RedisStore(redis.url, [ep], cfg)
        admin = aioredis.from_url(redis.url, socket_timeout=30)
        unhealthy, usage = f"{store.prefix}:unhealthy", f"{store.prefix}:usage:e"
        flushes = Calls(store.usage, "flush")
        await store.start()
        try:
            store.set_healthy(ep, False)
            await asyncio.sleep(0.2)
            assert await admin.smembers(unhealthy) == {b"e"}
            for _ in range(3):
                store.record("e", "m")
            sleeper = asyncio.create_task(admin.execute_command("DEBUG", "SLEEP", 2.5))
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            try:
                await store.usage.flush(store.link)
            except Exception as e:
                failed = type(e).__name__
            assert failed == "RedisTimeout" and time.monotonic() - t0 < REDIS_TIMEOUT + 0.2
            await until(lambda: store.degraded, 2.0)
            store.set_healthy(ep, True)
            await sleeper
            await until(lambda: not store.degraded, 4.0)
            await asyncio.sleep(0.2)
            assert await admin.smembers(unhealthy) == set()
            await flushes.next()  # the next sweep's flush sends the batch again
            assert await admin.hgetall(usage) == {b"m": b"3"}
            assert (await store.snapshot())["usage"] == {"e": {"m": 3}}
            # had the stalled call run after all, its batch would have come again just so
            assert await store.link.run("USAGE", store.owner, 1, "e", "m", 3) == 0
            assert await admin.hgetall(usage) == {b"m": b"3"}
        finally:
            await store.close()
            await admin.aclose()


async def test_recovery_ends_a_pubsub_reader_that_lost_its_cancel():
    """Recovery replaces the pub/sub reader right after dropping every connection, so the old
    reader is often resubscribing then, and redis-py can drop the cancel that ends it (Python
    3.11's wait_for returns a result that meets a cancel): it then reads on, with no deadline.
    Recovery waited for it for ever, degraded; it must end it and share limits again."""
    with RedisServer() as redis:
        cfg = parse_config(
            {
                "endpoints": [{"url": "http://127.0.0.1:1", "name": "e", "max_concurrent": 1}],
                "state": redis.url,
                "redis_timeout": REDIS_TIMEOUT,
            }
        )
        store = RedisStore(redis.url, [Endpoint.from_config(cfg.endpoints[0])], cfg)
        await store.start()
        try:

            async def reads_on() -> None:
                try:
                    await asyncio.Future()
                except asyncio.CancelledError:
                    pass  # the cancel that met a result
                await asyncio.Future()  # the next read, of a quiet subscription

            await store.messages.close()
            stuck = asyncio.create_task(reads_on())
            pubsub = await store.link.subscribe("x")
            store.messages._task, store.messages._pubsub = stuck, pubsub
            await asyncio.sleep(0)
            store._degrade(RuntimeError("an outage"))
            # the next sweep (within a second) recovers; a hung one never would
            await until(lambda: not store.degraded, 1.0 + REDIS_TIMEOUT + 1.0)
            assert stuck.done() and pubsub.connection is None
            assert store.messages._task is not None and not store.messages._task.done()
        finally:
            await store.close()
