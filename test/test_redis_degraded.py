"""While Redis is away, an instance keeps one table: its workers share their limits, and it
takes its share of each endpoint's slots (the slots divided by the instances Redis last knew
of), so that two instances of two workers each, with Redis killed, never put more requests
on an endpoint than its slots."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from mock import run_mock
from test.conftest import RedisServer
from test.helpers import endpoints
from test.router_proc import ready, router_workers

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
SLOTS = 4


async def health(url: str) -> dict[str, object]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        async with s.get(url + "/health") as r:
            body: dict[str, object] = await r.json()
            return body


async def test_two_instances_of_two_workers_stay_within_the_slots_while_redis_is_dead():
    with RedisServer() as redis:
        async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2, first_byte_delay_ms=150, parallel=64) as m:
            # lease_ttl 1.5 s: each worker sweeps (and so reports its instance) every 0.5 s
            cfg = {"endpoints": endpoints(m, slots=SLOTS), "state": redis.url, "queue_timeout": 60, "lease_ttl": 1.5}
            with router_workers(cfg, 2, wait=False) as (a, _), router_workers(cfg, 2, wait=False) as (b, _):
                await asyncio.gather(ready(a), ready(b))
                t0 = time.monotonic()  # until Redis knows both instances
                while not all([(await health(u)).get("instances") == 2 for u in (a, b)]):
                    assert time.monotonic() - t0 < 15, [await health(u) for u in (a, b)]
                    await asyncio.sleep(0.2)
                await asyncio.sleep(0.7)  # every worker has swept since: each knows its share
                redis.stop()
                async with aiohttp.ClientSession() as s, s.post(m.url + "/mock/reset") as r:
                    assert r.status == 200
                statuses: list[int] = []
                stop = time.monotonic() + 1.0

                async def client(url: str) -> None:
                    async with aiohttp.ClientSession() as s:
                        while time.monotonic() < stop:
                            async with s.post(url + "/api/chat", json=CHAT) as r:
                                await r.read()
                                statuses.append(r.status)

                await asyncio.gather(*(client(u) for u in (a, b) for _ in range(10)))
                degraded = [await health(u) for u in (a, b)]
    stats = m.stats()
    print(f"\n{len(statuses)} requests while Redis was dead, at most {stats['max_in_flight']} in flight")
    assert set(statuses) == {200}, set(statuses)
    assert all(h["degraded"] for h in degraded), degraded
    # 2 instances x 2 workers: 16 before; now each instance 4 // 2, its workers together
    assert stats["max_in_flight"] == SLOTS, stats["max_in_flight"]
