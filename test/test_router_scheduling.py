"""Admission limit, the work-conserving FIFO queue, and client disconnects: a contract
that every state store (memory, embedded shared, Redis) must keep."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from mock import run_mock
from test.conftest import RedisServer
from test.helpers import endpoints, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=["memory", "shared", "redis"])
def state(request, tmp_path, monkeypatch):
    """Extra router config selecting the store under test."""
    if request.param == "shared":
        monkeypatch.setenv("NOMYO_ROUTER_STATE_PATH", str(tmp_path / "state"))
        yield {"state": "shared"}
    elif request.param == "redis":
        with RedisServer() as r:
            yield {"state": r.url}
    else:
        yield {"state": "memory"}


async def post(s: aiohttp.ClientSession, url: str, body=CHAT, **kw):
    async with s.post(url + "/api/chat", json=body, **kw) as r:
        return r.status, r.headers.get("X-Router-Endpoint"), await r.read()


async def test_admission_is_exact_two_endpoints_two_slots_twenty_requests(state):
    async with run_mock(ttft_ms=20.0, tok_ms=5.0, tokens=4) as a, run_mock(ttft_ms=20.0, tok_ms=5.0, tokens=4) as b:
        async with run_router({"endpoints": endpoints(a, b, slots=2), **state}) as r, aiohttp.ClientSession() as s:
            results = await asyncio.gather(*[post(s, r.url) for _ in range(20)])
    assert [st for st, _, _ in results] == [200] * 20
    assert a.stats()["max_in_flight"] <= 2 and b.stats()["max_in_flight"] <= 2
    assert a.stats()["requests_total"] + b.stats()["requests_total"] == 20
    assert min(a.stats()["requests_total"], b.stats()["requests_total"]) >= 6  # both did work


async def test_queue_is_fifo(state):
    async with run_mock(ttft_ms=60.0, tok_ms=0.0, tokens=1) as m:
        async with run_router({"endpoints": endpoints(m, slots=1), **state}) as r, aiohttp.ClientSession() as s:
            assert (await post(s, r.url))[0] == 200  # warm up (store connections), then measure
            done: list[int] = []

            async def one(i: int):
                await asyncio.sleep(i * 0.025)  # arrive in order 0..5, well apart
                assert (await post(s, r.url))[0] == 200
                done.append(i)

            await asyncio.gather(*[one(i) for i in range(6)])
    assert done == [0, 1, 2, 3, 4, 5]
    assert m.stats()["max_in_flight"] == 1


async def test_queued_requests_take_the_first_freed_slot(state):
    async with (
        run_mock(ttft_ms=40.0, tok_ms=0.0, tokens=1) as fast,
        run_mock(ttft_ms=1000.0, tok_ms=0.0, tokens=1) as slow,
    ):
        async with (
            run_router({"endpoints": endpoints(fast, slow, slots=1), **state}) as r,
            aiohttp.ClientSession() as s,
        ):
            t0 = time.perf_counter()
            results = await asyncio.gather(*[post(s, r.url) for _ in range(6)])
            elapsed = time.perf_counter() - t0
    served = [ep for _, ep, _ in results]
    assert served.count("m1") == 1 and served.count("m0") == 5  # only the first request waits on slow
    assert elapsed < 1.8  # a second request on the slow backend would take 2 s


async def test_queue_is_work_conserving_across_models(state):
    async with (
        run_mock(ttft_ms=300.0, tok_ms=0.0, tokens=1, models=["x", "y"]) as shared,
        run_mock(ttft_ms=10.0, tok_ms=0.0, tokens=1, models=["y"]) as only_y,
    ):
        eps = endpoints(shared, only_y, slots=1)
        async with run_router({"endpoints": eps, **state}) as r, aiohttp.ClientSession() as s:
            xs = [asyncio.create_task(post(s, r.url, {**CHAT, "model": "x"})) for _ in range(3)]
            await asyncio.sleep(0.05)  # x fills the shared endpoint and queues behind it
            t0 = time.perf_counter()
            status, ep, _ = await post(s, r.url, {**CHAT, "model": "y"})
            y_time = time.perf_counter() - t0
            assert status == 200 and ep == "m1"
            assert y_time < 0.2  # y did not wait behind x
            assert [t[0] for t in await asyncio.gather(*xs)] == [200] * 3


async def test_queue_timeout_and_full_queue_answer_busy(state):
    async with run_mock(ttft_ms=800.0, tok_ms=0.0, tokens=1) as m:
        cfg = {"endpoints": endpoints(m, slots=1), "queue_timeout": 0.2, "max_queue": 1, **state}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            first = asyncio.create_task(post(s, r.url))
            await asyncio.sleep(0.05)
            second = asyncio.create_task(post(s, r.url))  # waits, then times out
            await asyncio.sleep(0.05)
            async with s.post(r.url + "/v1/chat/completions", json={**CHAT}) as full:
                assert full.status == 503 and full.headers["Retry-After"] == "1"
                assert (await full.json())["error"]["code"] == "queue_full"
            status, _, body = await second
            assert status == 503 and b"queue_timeout" in body
            assert (await first)[0] == 200


async def test_queued_client_that_leaves_is_dropped(state):
    async with run_mock(ttft_ms=300.0, tok_ms=0.0, tokens=1) as m:
        async with run_router({"endpoints": endpoints(m, slots=1), **state}) as r, aiohttp.ClientSession() as s:
            first = asyncio.create_task(post(s, r.url))
            await asyncio.sleep(0.05)
            try:
                await post(s, r.url, timeout=aiohttp.ClientTimeout(total=0.1))
            except TimeoutError:
                pass
            await asyncio.sleep(0.05)
            assert r.router.store.queue_length() == 0
            assert (await first)[0] == 200
            await asyncio.sleep(0.05)
    assert m.stats()["requests_total"] == 1  # the one that left never reached the backend


# Ours reports the disconnect through a hook; under plain uvicorn a watcher task notices it.
@pytest.mark.parametrize("http", ["nomyo_router.server.protocol:GuardedHttpToolsProtocol", "httptools"])
async def test_stream_disconnect_frees_the_slot(state, http):
    async with run_mock(ttft_ms=0.0, tok_ms=50.0, tokens=200) as m:
        async with run_router({"endpoints": endpoints(m, slots=1), **state}, http) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + "/api/chat", json={**CHAT, "stream": True}) as resp:
                await resp.content.readline()
                assert m.stats()["in_flight"] == 1
            await asyncio.sleep(0.2)
            assert m.stats()["in_flight"] == 0
            ep = r.router.endpoints[0]
            assert r.router.store.in_flight(ep) == 0
            assert r.router.store.is_healthy(ep)  # a cancel is not a backend failure
            m.update(tok_ms=0.0)
            assert (await post(s, r.url))[0] == 200
