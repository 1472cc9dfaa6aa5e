"""Several router instances sharing Redis: exact limits, one queue, shared pins,
leases that expire after SIGKILL, and surviving a Redis restart mid-load."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp

from mock import MockConfig, MockProcess, run_mock
from test.conftest import FAST, RedisServer
from test.helpers import endpoints, fifo, run_router
from test.router_proc import router_workers
from test.waits import Calls, until

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}


async def test_two_instances_share_slots_and_one_fifo_queue(redis_url):
    async with run_mock(ttft_ms=200.0, tok_ms=0.0, tokens=1, parallel=64) as m:
        cfg = {"endpoints": endpoints(m, slots=2), "state": redis_url}
        async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:
            flushes = [Calls(r.router.store.usage, "flush") for r in (r1, r2)]
            for r in (r1, r2):  # warm each instance (Redis connections, script loading): the
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:  # queue order is
                    await resp.read()  # what is tested, not a cold first call
            await s.post(m.url + "/mock/reset")
            t0 = time.perf_counter()

            async def one(i: int):
                await asyncio.sleep(i * 0.04)  # both instances share this test's event loop
                url = (r1 if i % 2 else r2).url
                async with s.post(url + "/api/chat", json=CHAT) as r:
                    await r.read()
                    return r.status, i, time.perf_counter() - t0

            results = await asyncio.gather(*[one(i) for i in range(40)])
            await asyncio.gather(*(f.next() for f in flushes))  # usage goes to Redis with the next sweep
            async with s.get(r1.url + "/health") as h:
                health = await h.json()
    assert [st for st, _, _ in results] == [200] * 40
    assert m.stats()["max_in_flight"] == 2
    done_at = [t for _, _, t in sorted(results, key=lambda r: r[1])]
    assert fifo(done_at, 0.2), done_at
    assert done_at[-1] - done_at[0] >= 18 * 0.2  # 20 waves: nobody jumped the slots
    assert health["state"] == "redis" and health["endpoints"][0]["in_flight"] == 0
    assert health["usage"] == {"m0": {"llama3:latest": 42}}  # both instances (2 warm-ups + 40)


async def test_a_conversation_keeps_its_backend_across_instances(redis_url):
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        cfg = {"endpoints": endpoints(a, b), "state": redis_url}
        async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:
            msgs = [{"role": "user", "content": "across instances"}]
            seen = []
            for i in range(10):
                async with s.post(
                    (r1, r2)[i % 2].url + "/api/chat", json={"model": "llama3", "stream": False, "messages": msgs}
                ) as r:
                    body = await r.json()
                    seen.append((r.headers["X-Router-Endpoint"], r.headers["X-Router-Affinity"]))
                msgs = msgs + [body["message"], {"role": "user", "content": f"turn {i}"}]
    assert len({ep for ep, _ in seen}) == 1
    assert [aff for _, aff in seen[1:]] == ["hit"] * 9


async def test_sigkill_of_a_worker_holding_slots_returns_them_within_the_lease(redis_url):
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=50.0, tokens=200, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 1}], "state": redis_url, "lease_ttl": 1.5}
        with router_workers(cfg, 2) as (url, _):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                held = await s.post(url + "/api/chat", json={**CHAT, "stream": True})
                await held.content.readline()
                os.kill(int(held.headers["X-Router-Worker"]), signal.SIGKILL)
                t0 = time.perf_counter()
                async with s.post(url + "/api/chat", json={**CHAT, "options": {"num_predict": 1}}) as r:
                    assert r.status == 200
                    await r.read()
                waited = time.perf_counter() - t0
                held.close()
    assert waited < 1.5 + 1.0  # within the lease time (plus one sweep), not the 10 s stream


async def test_redis_restart_mid_load_loses_nothing_and_sharing_resumes():
    with RedisServer() as redis:
        async with run_mock(ttft_ms=5.0, tok_ms=0.0, tokens=2, parallel=64) as m:
            cfg = {"endpoints": endpoints(m, slots=4), "state": redis.url}
            async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:
                stop = asyncio.Event()

                async def client(url: str) -> list[int]:
                    out = []
                    while not stop.is_set():
                        async with s.post(url + "/api/chat", json=CHAT) as r:
                            await r.read()
                            out.append(r.status)
                    return out

                stores = [r.router.store for r in (r1, r2)]
                load = [asyncio.create_task(client(r.url)) for r in (r1, r2, r1, r2)]
                await asyncio.sleep(0.5)
                redis.stop()
                await until(lambda: all(st.degraded for st in stores), 3.0)  # both serve on local limits
                await asyncio.sleep(0.5)  # (and do, under the load)
                degraded = (await (await s.get(r1.url + "/health")).json())["state"]
                redis.start()
                await until(lambda: not any(st.degraded for st in stores), 4.0)  # both share again
                await asyncio.sleep(0.5)  # (and do, under the load)
                stop.set()
                statuses = [st for t in await asyncio.gather(*load) for st in t]
                h1 = await (await s.get(r1.url + "/health")).json()
                store = r1.router.store
    assert statuses and set(statuses) == {200}, set(statuses)
    assert degraded == "redis" and store.degraded_events >= 1
    assert store.degraded is False  # sharing resumed
    assert h1["state"] == "redis"


async def test_waiters_queued_in_redis_are_served_locally_when_redis_vanishes():
    with RedisServer() as redis:
        async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2, first_byte_delay_ms=250, parallel=64) as m:
            cfg = {"endpoints": endpoints(m, slots=1), "state": redis.url, "queue_timeout": 60}
            async with run_router(cfg) as r, aiohttp.ClientSession() as s:

                async def one() -> tuple[int, float]:
                    t0 = time.monotonic()
                    async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                        await resp.read()
                        return resp.status, time.monotonic() - t0

                load = [asyncio.create_task(one()) for _ in range(12)]
                await asyncio.sleep(0.4)  # one in flight, the rest queued in Redis
                redis.stop()
                await asyncio.sleep(0.2)
                redis.start()
                results = await asyncio.gather(*load)
    assert [st for st, _ in results] == [200] * 12
    # 12 x 0.25 s of service; nobody waits for queue_timeout (60 s) in a queue that is gone
    assert max(t for _, t in results) < 12 * 0.25 + 5
