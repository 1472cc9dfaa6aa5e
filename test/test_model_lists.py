"""One model list per router, whatever the worker count: a model copied or deleted through
one worker of `nomyo-router --workers 4` is listed, shown and served (or 404) by every
worker as soon as the management call has answered.

Each probe is one fresh connection (so probes spread over the workers) that asks, in
order and on that same connection (so the same worker answers all of it): /api/tags,
/v1/models, /api/show NAME, a generation with NAME, and a generation with a model that
always exists, whose `X-Router-Worker` header names the worker that answered the rest.
Against the mock (fast) and the real Ollama of ../shared/real-backends."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from mock import MockConfig, MockProcess
from test import real_backends
from test.router_proc import ready, router_workers

WORKERS = 4
PROBES = 24


async def probe(url: str, name: str, base: str) -> dict[str, Any]:
    """What one worker says about `name`, on one keep-alive connection."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        async with s.get(url + "/api/tags") as r:
            tags = {m["name"] for m in (await r.json())["models"]}
        async with s.get(url + "/v1/models") as r:
            ids = {m["id"] for m in (await r.json())["data"]}
        async with s.post(url + "/api/show", json={"model": name}) as r:
            await r.read()
            show = r.status
        gen = {"model": name, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
        async with s.post(url + "/api/generate", json=gen) as r:
            await r.read()
            generated = r.status
        async with s.post(url + "/api/generate", json={**gen, "model": base}) as r:
            await r.read()
            worker = r.headers.get("X-Router-Worker")
    return {
        "listed": f"{name}:latest" in tags,
        "v1": name in ids or f"{name}:latest" in ids,
        "show": show,
        "generate": generated,
        "worker": worker,
    }


def stale(answers: list[dict[str, Any]], present: bool) -> list[dict[str, Any]]:
    """The answers that disagree with the backends (`present`: the model exists there)."""
    if present:
        return [a for a in answers if not (a["listed"] and a["v1"] and a["show"] == 200 and a["generate"] == 200)]
    return [a for a in answers if a["listed"] or a["v1"] or a["show"] != 404 or a["generate"] != 404]


async def copy_then_delete(url: str, base: str, rounds: int) -> tuple[int, int, set[str]]:
    """`rounds` times: copy `base`, probe, delete, probe. (stale answers, answers, workers seen)."""
    bad: list[dict[str, Any]] = []
    total = 0
    workers: set[str] = set()
    async with aiohttp.ClientSession() as s:
        for n in range(rounds):
            name = f"{base}-copy-{os.getpid()}-{n}"
            async with s.post(url + "/api/copy", json={"source": base, "destination": name}) as r:
                assert r.status == 200, await r.text()
            for present in (True, False):
                answers = await asyncio.gather(*(probe(url, name, base) for _ in range(PROBES)))
                bad += stale(answers, present)
                total += len(answers)
                workers |= {a["worker"] for a in answers if a["worker"]}
                if present:
                    async with s.delete(url + "/api/delete", json={"model": name}) as r:
                        assert r.status == 200, await r.text()
    return len(bad), total, workers


async def test_a_copy_and_a_delete_are_seen_by_every_worker_mock():
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=1, parallel=64, models=["tiny"])) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "mock", "max_concurrent": 64}],
            "model_refresh_interval": 3600,
        }  # only the change itself may spread the news
        with router_workers(cfg, WORKERS) as (url, _):
            bad, total, workers = await copy_then_delete(url, "tiny", 5)
    assert len(workers) >= 2, workers  # the probes really spread over workers
    assert bad == 0, f"{bad} stale answers of {total}"


async def test_a_worker_killed_is_not_waited_for(tmp_path):
    """kill -9 of a worker (not the state host): the next change answers at once (the pid
    is gone: no acknowledgement awaited from it) and the survivors all see it."""
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=1, parallel=64, models=["tiny"])) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "mock", "max_concurrent": 64}], "model_refresh_interval": 3600}
        base = str(tmp_path / "state")
        with router_workers(cfg, 3, state_path=base) as (url, _):
            host = int(open(base + ".lock").read())
            others: set[int] = set()
            for _ in range(20):  # (until a probe reaches a worker that is not the host)
                answers = await asyncio.gather(*(probe(url, "tiny", "tiny") for _ in range(PROBES)))
                others |= {int(a["worker"]) for a in answers if a["worker"] and int(a["worker"]) != host}
                if others:
                    break
            victim = min(others)
            os.kill(victim, signal.SIGKILL)
            await asyncio.sleep(0.3)
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                async with s.post(url + "/api/copy", json={"source": "tiny", "destination": "after-kill"}) as r:
                    assert r.status == 200
                took = time.monotonic() - t0
            answers = await asyncio.gather(*(probe(url, "after-kill", "tiny") for _ in range(PROBES)))
    assert took < 1.0, took
    assert not stale(answers, True)


async def subscribed(redis_url: str, count: int, within: float = 15.0) -> None:
    """Until `count` subscribers listen to the routers' shared channel (`<prefix>:pub`)."""
    import redis.asyncio as aioredis

    admin = aioredis.from_url(redis_url)
    try:
        deadline = time.monotonic() + within
        while True:
            channels = await admin.pubsub_channels("*:pub")
            listening = sum(n for _, n in await admin.pubsub_numsub(*channels)) if channels else 0
            if listening >= count:
                return
            assert time.monotonic() < deadline, f"{listening} of {count} workers subscribed"
            await asyncio.sleep(0.02)
    finally:
        await admin.aclose()


async def test_the_same_through_redis(redis_url):
    """Workers that share state through Redis (as instances on several hosts would)."""
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=1, parallel=64, models=["tiny"])) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "mock", "max_concurrent": 64}],
            "model_refresh_interval": 3600,
            "state": redis_url,
        }
        with router_workers(cfg, WORKERS) as (url, _):
            await subscribed(redis_url, WORKERS)  # (each one's subscription starts in the background)
            bad, total, workers = await copy_then_delete(url, "tiny", 3)
    assert len(workers) >= 2, workers
    assert bad == 0, f"{bad} stale answers of {total}"


async def test_one_worker_polls_for_all_and_all_apply_it():
    """model_refresh_interval 0.5 s, 4 workers: about one /api/tags poll per interval in
    all (not one per worker: 6 or 7 in 3 s, not 24), and a model that appears at the backend
    (not through the router) is listed by every worker once the next poll has seen it."""
    from aiohttp import web

    polls: list[float] = []
    models = ["tiny:latest"]

    async def tags(request: web.Request) -> web.Response:
        polls.append(time.monotonic())
        return web.json_response({"models": [{"name": n, "model": n} for n in models]})

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.12.6"})

    async def ps(request: web.Request) -> web.Response:
        return web.json_response({"models": []})

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        cfg = {"endpoints": [{"url": f"http://127.0.0.1:{port}", "name": "counted"}], "model_refresh_interval": 0.5}
        with router_workers(cfg, WORKERS, wait=False) as (url, _):  # (this loop serves the backend)
            await ready(url)
            await asyncio.sleep(1.5)  # (every worker up and known to the others)
            t0 = time.monotonic()
            await asyncio.sleep(3.0)
            counted = sum(1 for t in polls if t0 <= t < t0 + 3.0)
            models.append("fresh:latest")
            seen_at = time.monotonic()
            for _ in range(100):  # the next poll (within an interval) sees it
                if polls[-1] > seen_at:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # (and the poller shares it)
            listed = []
            for _ in range(PROBES):
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                    async with s.get(url + "/api/tags") as r:
                        listed.append("fresh:latest" in {m["name"] for m in (await r.json())["models"]})
    finally:
        await runner.cleanup()
    print(f"{counted} /api/tags polls in 3 s")
    assert counted <= 9, f"{counted} polls in 3 s at a 0.5 s interval"  # one per worker: ~24
    assert all(listed), f"{listed.count(False)} of {len(listed)} answers without the new model"


@pytest.fixture(scope="module")
def ollama_url() -> Iterator[str]:
    yield from real_backends.ollama_server("no real Ollama to manage", parallel=4)


async def test_a_copy_and_a_delete_are_seen_by_every_worker_real_ollama(ollama_url):
    cfg = {"endpoints": [{"url": ollama_url, "name": "real", "max_concurrent": 4}], "model_refresh_interval": 3600}
    with router_workers(cfg, WORKERS) as (url, _):
        bad, total, workers = await copy_then_delete(url, "tiny", 2)
    assert len(workers) >= 2, workers
    assert bad == 0, f"{bad} stale answers of {total}"
