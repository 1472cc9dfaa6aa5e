"""Fair queuing with priorities: waiting requests are served by priority, then by each client
key's weighted share, FIFO within a key — in one process, under --workers 2 and with Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.domain import Endpoint
from nomyo_router.state import Ask, MemoryStore
from nomyo_router.state.queue_order import spec
from test.helpers import run_router
from test.router_proc import router_workers

A, B, C = (f"{n}-key-0123456789" for n in ("flood", "light", "urgent"))
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
SERVICE = 0.1  # the mock's time per request (ttft 100 ms, one token)


def keys(**extra: dict[str, Any]) -> list[dict[str, Any]]:
    out = [{"name": "flood", "key": A}, {"name": "light", "key": B}, {"name": "urgent", "key": C}]
    for entry in out:
        entry.update(extra.get(entry["name"], {}))
    return out


# ---- the store's order -------------------------------------------------------------------
async def _grants(store: MemoryStore, ep: Endpoint, arrivals: list[tuple[str, Any]]) -> list[str]:
    """Hold the one slot, queue `arrivals` (name, fair spec) in order, then free the slot again
    and again: the names in the order they were handed it."""
    held = await store.acquire(Ask(model="m", candidates=[ep], choose=lambda free: free[0], timeout=5))
    got: list[str] = []

    async def wait(name: str, fair: Any) -> None:
        lease = await store.acquire(Ask(model="m", candidates=[ep], choose=lambda free: free[0], timeout=5, fair=fair))
        got.append(name)
        await asyncio.sleep(0)
        lease.release()

    tasks = []
    for name, fair in arrivals:
        tasks.append(asyncio.create_task(wait(name, fair)))
        await asyncio.sleep(0)  # (queued in this order)
    held.release()
    await asyncio.gather(*tasks)
    return got


async def test_a_light_key_waits_behind_one_request_of_a_flood_not_all_of_it():
    store, ep = MemoryStore(1000), Endpoint("e", "http://x", 1)
    flood, light = spec("flood", 0, 1.0), spec("light", 0, 1.0)
    got = await _grants(store, ep, [("flood", flood)] * 20 + [("light", light)])
    assert got.index("light") <= 1  # not 20th: one of the flood's at most


async def test_priority_is_strict_and_weights_share():
    store, ep = MemoryStore(1000), Endpoint("e", "http://x", 1)
    heavy, light, urgent = spec("heavy", 0, 3.0), spec("light", 0, 1.0), spec("urgent", 1, 1.0)
    arrivals = [("heavy", heavy)] * 30 + [("light", light)] * 30 + [("urgent", urgent)] * 2
    got = await _grants(store, ep, arrivals)
    assert got[:2] == ["urgent", "urgent"]  # last to come, first served
    first = got[2:42]
    assert abs(first.count("heavy") - 30) <= 2 and abs(first.count("light") - 10) <= 2  # 3 : 1


async def test_no_keys_is_fifo_and_a_cancelled_request_is_not_charged():
    store, ep = MemoryStore(1000), Endpoint("e", "http://x", 1)
    got = await _grants(store, ep, [(str(i), None) for i in range(10)])
    assert got == [str(i) for i in range(10)]
    held = await store.acquire(Ask(model="m", candidates=[ep], choose=lambda free: free[0], timeout=5))
    a = spec("a", 0, 1.0)
    gone = [
        asyncio.create_task(store.acquire(Ask(model="m", candidates=[ep], choose=lambda f: f[0], timeout=5, fair=a)))
        for _ in range(5)
    ]
    await asyncio.sleep(0)
    for t in gone:  # five of a's requests leave the queue without a slot
        t.cancel()
    await asyncio.gather(*gone, return_exceptions=True)
    held.release()
    got = await _grants(store, ep, [("b", spec("b", 0, 1.0))] * 3 + [("a", a)])
    assert got.index("a") <= 1  # its cancelled ones did not push it back


# ---- on the wire ---------------------------------------------------------------------------
async def _flood_then(url: str, late: list[tuple[str, str]], flood: int = 12) -> dict[str, list[float]]:
    """`flood` requests of key A at once, then (after the first is served) one request of each
    `late` key: each key's latencies, in seconds."""
    out: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

        async def one(name: str, key: str, delay: float) -> None:
            await asyncio.sleep(delay)
            t0 = time.perf_counter()
            async with s.post(url + "/api/chat", json=CHAT, headers={"Authorization": f"Bearer {key}"}) as r:
                await r.read()
                assert r.status == 200, await r.text()
            out.setdefault(name, []).append(time.perf_counter() - t0)

        await asyncio.gather(
            *[one("flood", A, 0.0) for _ in range(flood)], *[one(name, key, SERVICE * 1.5) for name, key in late]
        )
    return out


def _mock() -> MockProcess:
    return MockProcess(MockConfig(ttft_ms=SERVICE * 1000, tok_ms=0.0, tokens=1, parallel=8))


async def test_fair_and_strict_in_one_process():
    async with run_mock(ttft_ms=SERVICE * 1000, tok_ms=0.0, tokens=1, parallel=8) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "one", "max_concurrent": 1}],
            "queue_timeout": 30,
            "client_keys": keys(urgent={"priority": 5}),
        }
        async with run_router(cfg) as r:
            got = await _flood_then(r.url, [("light", B), ("urgent", C)])
    assert max(got["flood"]) > 10 * SERVICE
    assert got["urgent"][0] < 3.5 * SERVICE < 4.5 * SERVICE > got["light"][0]
    assert got["urgent"][0] < got["light"][0]


async def test_fair_and_strict_across_workers():
    with _mock() as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "one", "max_concurrent": 1}],
            "queue_timeout": 30,
            "client_keys": keys(urgent={"priority": 5}),
        }
        with router_workers(cfg, 2) as (url, _):
            got = await _flood_then(url, [("light", B), ("urgent", C)])
    # alone, the flood's last waits ~12 service times; the late ones wait ~1-2 (urgent first)
    assert max(got["flood"]) > 10 * SERVICE
    assert got["urgent"][0] < 3.5 * SERVICE
    assert got["light"][0] < 4.5 * SERVICE
    assert got["urgent"][0] < got["light"][0]


async def test_weights_across_instances_with_redis(redis_url):
    async with run_mock(ttft_ms=SERVICE * 1000, tok_ms=0.0, tokens=1, parallel=8) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "one", "max_concurrent": 1}],
            "state": redis_url,
            "queue_timeout": 30,
            "client_keys": keys(flood={"weight": 3.0}),
        }
        async with run_router(cfg) as r1, run_router(cfg) as r2:
            order: list[str] = []
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

                async def one(url: str, name: str, key: str) -> None:
                    async with s.post(url + "/api/chat", json=CHAT, headers={"Authorization": f"Bearer {key}"}) as resp:
                        await resp.read()
                        assert resp.status == 200
                    order.append(name)

                await asyncio.gather(
                    *[one(r.url, "flood", A) for r in (r1, r2) for _ in range(8)],
                    *[one(r.url, "light", B) for r in (r1, r2) for _ in range(8)],
                )
            late = await _flood_then(r2.url, [("light", B)], flood=10)
    first = order[1:13]  # (the first served took the free slot before anyone waited)
    assert 7 <= first.count("flood") <= 11, order  # 3 : 1 of the slot while both wait
    assert late["light"][0] < 6.5 * SERVICE  # behind the one served and at most ~3 of the flood (weight 3)
