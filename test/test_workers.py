"""One router, many worker processes: exact limits, one FIFO queue, shared pins, and a
worker killed with SIGKILL while it holds slots."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp

from mock import MockConfig, MockProcess
from nomyo_router.config import parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, picker
from nomyo_router.state import WorkerStore
from test.helpers import fifo
from test.router_proc import ready, router_workers

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}


async def burst(url: str, n: int, gap: float = 0.01) -> list[tuple[int, int, float]]:
    """n requests sent `gap` apart, each on its own connection (so they spread over workers)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        t0 = time.perf_counter()

        async def one(i: int):
            await asyncio.sleep(i * gap)
            async with s.post(url + "/api/chat", json=CHAT) as r:
                await r.read()
                return r.status, i, time.perf_counter() - t0, r.headers.get("X-Router-Worker")

        return await asyncio.gather(*[one(i) for i in range(n)])


async def test_four_workers_one_endpoint_two_slots_forty_requests_fifo():
    with MockProcess(MockConfig(ttft_ms=200.0, tok_ms=0.0, tokens=1, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 2}]}
        with router_workers(cfg, 4) as (url, _):
            # 40 ms apart: more than scheduling jitter, far less than a 200 ms wave
            results = await burst(url, 40, gap=0.04)
            async with aiohttp.ClientSession() as s:
                stats = await (await s.get(m.url + "/mock/stats")).json()
                # a request is counted as it ends, just after its answer went out: the last
                # ones may still be ending when the burst has its answers
                for _ in range(50):
                    health = await (await s.get(url + "/health")).json()
                    if sum(health["usage"].get("one", {}).values()) >= 40:
                        break
                    await asyncio.sleep(0.05)
    assert [st for st, *_ in results] == [200] * 40
    assert stats["max_in_flight"] == 2
    assert health["usage"] == {"one": {"llama3:latest": 40}}  # counted once, over all workers
    assert len({w for *_, w in results}) >= 2  # the load really spread over workers
    done_at = [t for _, _, t, _ in sorted(results, key=lambda r: r[1])]
    assert fifo(done_at, 0.2), done_at  # FIFO: nobody overtook a request sent before it
    assert done_at[-1] - done_at[0] >= 18 * 0.2  # 40 requests / 2 slots = 20 waves of 200 ms
    assert health["state"] == "shared"


async def test_sigkill_of_a_worker_holding_slots_gives_them_back():
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=50.0, tokens=200, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 2}]}
        with router_workers(cfg, 3) as (url, _):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                streams = []
                for _ in range(2):  # two 10-second streams take both slots
                    r = await s.post(url + "/api/chat", json={**CHAT, "stream": True})
                    await r.content.readline()
                    streams.append(r)
                holders = {r.headers["X-Router-Worker"] for r in streams}
                victim = int(sorted(holders)[0])
                os.kill(victim, signal.SIGKILL)
                t0 = time.perf_counter()
                async with s.post(url + "/api/chat", json={**CHAT, "stream": True, "options": {"num_predict": 1}}) as r:
                    assert r.status == 200
                    await r.read()
                waited = time.perf_counter() - t0
                for r in streams:
                    r.close()
            assert waited < 3.0  # the victim's slot came back at once, not after its 10 s stream


async def test_a_conversation_keeps_its_backend_across_workers(tmp_path):
    """Turn 1 is served by some worker; that worker is then killed, so every later turn is
    served by another one, which must find the pin. The test process hosts the shared
    state itself (it wins the election by starting first), so killing any worker is safe."""
    cfg_m = MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=4, parallel=64)
    with MockProcess(cfg_m) as a, MockProcess(cfg_m) as b:
        cfg = {"endpoints": [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b"}]}
        base = str(tmp_path / "state")
        eps = [Endpoint.from_config(e) for e in parse_config(cfg).endpoints]
        host = WorkerStore(base, eps, 100, 600, 1000, picker(LeastBusy()))
        await host.start()
        assert host.is_host
        try:
            with router_workers(cfg, 3, state_path=base, wait=False) as (url, _):
                await ready(url)
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

                    async def turn(msgs):
                        async with s.post(
                            url + "/api/chat", json={"model": "llama3", "stream": False, "messages": msgs}
                        ) as r:
                            body = await r.json()
                            return (
                                body["message"],
                                r.headers["X-Router-Endpoint"],
                                r.headers["X-Router-Affinity"],
                                int(r.headers["X-Router-Worker"]),
                            )

                    msgs = [{"role": "user", "content": "across workers"}]
                    answer, home, _, first_worker = await turn(msgs)
                    os.kill(first_worker, signal.SIGKILL)
                    await asyncio.sleep(0.3)
                    seen = []
                    for i in range(9):
                        msgs = msgs + [answer, {"role": "user", "content": f"turn {i}"}]
                        answer, ep, aff, worker = await turn(msgs)
                        seen.append((ep, aff, worker))
        finally:
            await host.close()
    assert {ep for ep, _, _ in seen} == {home}
    assert [aff for _, aff, _ in seen] == ["hit"] * 9
    assert first_worker not in {w for _, _, w in seen}


async def test_the_state_host_dies_and_a_survivor_takes_over(tmp_path):
    with MockProcess(MockConfig(ttft_ms=50.0, tok_ms=0.0, tokens=1, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 2}]}
        base = str(tmp_path / "state")
        with router_workers(cfg, 3, state_path=base) as (url, _):
            await burst(url, 6)
            host = int(open(base + ".lock").read())
            os.kill(host, signal.SIGKILL)
            await asyncio.sleep(0.5)
            async with aiohttp.ClientSession() as s:
                await s.post(m.url + "/mock/reset")
            results = await burst(url, 30)
            async with aiohttp.ClientSession() as s:
                stats = await (await s.get(m.url + "/mock/stats")).json()
            new_host = int(open(base + ".lock").read())
    assert [st for st, *_ in results] == [200] * 30
    assert stats["max_in_flight"] == 2
    assert new_host != host
