"""A reload re-homes the queue: requests waiting for an endpoint the reload removes move to
the endpoints that serve their model now (one the reload added included), in their FIFO
order, or are answered 503 at once when none does; the same when discovery finds the model
gone. One process (memory and Redis state), two shared-store workers in this process (the
order across workers, deterministically) and `nomyo-router --workers 2` (SIGHUP)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
import pytest
import yaml

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.config import parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import LeastBusy, RouteContext, picker
from nomyo_router.routing.scheduler import Scheduler
from nomyo_router.runtime import reconfigure as reload
from nomyo_router.state import WorkerStore
from test.helpers import TEST_USAGE_DB, run_router
from test.router_proc import router_workers

N = 4
SERVE_MS = 100.0  # each request on the new endpoint: served one after another (1 slot)
LONG = dict(ttft_ms=30_000.0, tok_ms=0.0, tokens=2)  # holds the old endpoint's one slot
QUICK = dict(ttft_ms=SERVE_MS, tok_ms=0.0, tokens=2)


def chat(api: str, i: int, model: str = "llama3") -> tuple[str, dict[str, Any]]:
    msg = [{"role": "user", "content": f"request {i}"}]
    if api == "openai":
        return "/v1/chat/completions", {"model": model, "messages": msg, "stream": False}
    return "/api/chat", {"model": model, "messages": msg, "stream": False}


async def send(s: aiohttp.ClientSession, url: str, i: int, api: str = "ollama") -> dict[str, Any]:
    path, body = chat(api, i)
    async with s.post(url + path, json=body) as resp:
        return {
            "i": i,
            "status": resp.status,
            "ep": resp.headers.get("X-Router-Endpoint"),
            "worker": resp.headers.get("X-Router-Worker"),
            "body": await resp.json(content_type=None),
            "done": time.monotonic(),
        }


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def queue_up(s: aiohttp.ClientSession, url: str, queued: Any, apis: list[str]) -> list[asyncio.Task]:
    """One request holding the only slot, then one per `apis` entry, each queued before the
    next is sent (so the FIFO order is the index)."""
    hold = asyncio.create_task(send(s, url, -1))
    await until(lambda: queued(0, held=1), "the long request to hold the slot")
    tasks = []
    for i, api in enumerate(apis):
        tasks.append(asyncio.create_task(send(s, url, i, api)))
        await until(lambda n=i + 1: queued(n), f"request {i} to queue")
    return [hold, *tasks]


def served_in_order(results: list[dict[str, Any]], t0: float, by: str = "b") -> None:
    print("served after the reload (s):", [round(r["done"] - t0, 3) for r in results])
    assert [r["status"] for r in results] == [200] * len(results), results
    assert {r["ep"] for r in results} == {by}
    done = [r["done"] for r in results]
    assert done == sorted(done), f"not served in FIFO order: {[round(d - t0, 3) for d in done]}"
    assert done[-1] - t0 < 1.0 + len(results) * SERVE_MS / 1000, f"last served {done[-1] - t0:.3f} s after"
    assert done[0] - t0 < 1.0, f"first served {done[0] - t0:.3f} s after the reload"


def config(state: str | None, *eps: tuple[str, str, int], **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "endpoints": [{"url": u, "name": n, "max_concurrent": c} for n, u, c in eps],
        "queue_timeout": 30,
        **extra,
    }
    if state:
        cfg["state"] = state
    return cfg


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("redis_url") if request.param == "redis" else None


def in_process_queued(r: Any) -> Any:
    async def queued(n: int, held: int = 0) -> bool:
        store = r.router.store
        if held:
            return sum(store.in_flight(e) for e in r.router.endpoints) == held
        return store.queue_length() == n

    return queued


async def finish(hold: asyncio.Task) -> None:
    hold.cancel()
    await asyncio.gather(hold, return_exceptions=True)


async def test_reload_moves_queued_requests_to_the_new_endpoint_in_order(state):
    async with run_mock(**LONG) as a, run_mock(**QUICK) as b:
        async with run_router(config(state, ("a", a.url, 1))) as r, aiohttp.ClientSession() as s:
            hold, *tasks = await queue_up(s, r.url, in_process_queued(r), ["ollama", "openai"] * (N // 2))
            t0 = time.monotonic()
            done = await reload.apply(
                r.router, parse_config({"usage_db": TEST_USAGE_DB, **config(state, ("b", b.url, 1))})
            )
            assert done["removed"] == ["a"] and done["added"] == ["b"]
            results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
            served_in_order(results, t0)
            assert r.router.store.queue_length() == 0
            await finish(hold)


async def test_queued_requests_may_use_an_endpoint_the_reload_adds(state):
    """Nothing removed: the queued requests take the new endpoint, and the old one's next."""
    async with run_mock(**LONG) as a, run_mock(**QUICK) as b:
        async with run_router(config(state, ("a", a.url, 1))) as r, aiohttp.ClientSession() as s:
            hold, *tasks = await queue_up(s, r.url, in_process_queued(r), ["ollama"] * N)
            t0 = time.monotonic()
            await reload.apply(
                r.router, parse_config({"usage_db": TEST_USAGE_DB, **config(state, ("a", a.url, 1), ("b", b.url, 1))})
            )
            served_in_order(await asyncio.wait_for(asyncio.gather(*tasks), 5), t0)
            await finish(hold)


async def test_reload_removing_the_last_endpoint_of_a_model_answers_503_at_once(state):
    async with run_mock(**LONG) as a, run_mock(models=["other"], **QUICK) as c:
        async with run_router(config(state, ("a", a.url, 1))) as r, aiohttp.ClientSession() as s:
            hold, *tasks = await queue_up(s, r.url, in_process_queued(r), ["ollama", "openai"])
            t0 = time.monotonic()
            await reload.apply(r.router, parse_config({"usage_db": TEST_USAGE_DB, **config(state, ("c", c.url, 1))}))
            ollama, openai = await asyncio.wait_for(asyncio.gather(*tasks), 5)
            print("answered 503 after the reload (s):", [round(x["done"] - t0, 3) for x in (ollama, openai)])
            assert max(ollama["done"], openai["done"]) - t0 < 0.5
            assert ollama["status"] == openai["status"] == 503
            assert isinstance(ollama["body"]["error"], str) and "llama3" in ollama["body"]["error"]
            assert openai["body"]["error"]["code"] == "no_healthy_endpoint"
            async with s.post(r.url + "/api/chat", json=chat("ollama", 9)[1]) as resp:
                assert resp.status == 404  # a new request: the model is unknown now
            await finish(hold)


async def test_rediscovery_that_finds_the_model_gone_answers_its_queue_at_once():
    async with run_mock(**LONG) as a:
        async with run_router(config(None, ("a", a.url, 1))) as r, aiohttp.ClientSession() as s:
            hold, *tasks = await queue_up(s, r.url, in_process_queued(r), ["ollama"] * 2)
            a.update(models=["other"])
            t0 = time.monotonic()
            await r.router.discovery.refresh_endpoint(r.router.endpoints[0])
            results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
            assert [x["status"] for x in results] == [503, 503]
            assert max(x["done"] for x in results) - t0 < 0.5
            await finish(hold)


def rewrite(path: str, endpoints: list[dict[str, Any]]) -> None:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg["endpoints"] = endpoints
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(cfg, f)
    os.replace(path + ".tmp", path)


async def test_sighup_with_two_workers_moves_the_queue_in_order():
    long_cfg = MockConfig(**LONG)
    quick = MockConfig(**QUICK)
    other = MockConfig(models=["other"], **QUICK)
    with MockProcess(long_cfg) as a, MockProcess(quick) as b, MockProcess(other) as c:
        with router_workers(config(None, ("a", a.url, 1)), 2) as (url, proc):
            path = proc.args[proc.args.index("--config") + 1]

            async def queued(n: int, held: int = 0) -> bool:
                async with s.get(url + "/health") as resp:
                    h = await resp.json()
                if held:
                    return sum(e["in_flight"] for e in h["endpoints"]) == held
                return h["queue_length"] == n

            async with aiohttp.ClientSession() as s:
                # (several connections: the kernel spreads them over both workers)
                hold, *tasks = await queue_up(s, url, queued, ["ollama", "openai"] * (N // 2))
                rewrite(path, [{"url": b.url, "name": "b", "max_concurrent": 1}])
                t0 = time.monotonic()
                os.kill(proc.pid, signal.SIGHUP)
                results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
                print("by worker:", [x["worker"] for x in results])  # (the kernel spreads them, or not)
                served_in_order(results, t0)
                await finish(hold)

                # and with no endpoint left for the model: answered at once
                rewrite(path, [{"url": a.url, "name": "a", "max_concurrent": 1}])
                os.kill(proc.pid, signal.SIGHUP)
                await asyncio.sleep(1.0)  # (every worker has it: /health answers from one of them)
                hold, *tasks = await queue_up(s, url, queued, ["ollama", "openai"])
                rewrite(path, [{"url": c.url, "name": "c", "max_concurrent": 1}])
                t0 = time.monotonic()
                os.kill(proc.pid, signal.SIGHUP)
                results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
                print("answered 503 after SIGHUP (s):", [round(x["done"] - t0, 3) for x in results])
                assert [x["status"] for x in results] == [503, 503]
                assert max(x["done"] for x in results) - t0 < 1.0
                await finish(hold)


def endpoint(name: str, slots: int = 1) -> Endpoint:
    ep = Endpoint(name=name, url="http://127.0.0.1:9", slots=slots)
    ep.set_models(["llama3"])
    return ep


async def test_the_first_worker_to_reload_moves_every_workers_queue_in_one_order(tmp_path):
    """Two workers, each with its own endpoint objects (as in two processes), requests queued
    alternately from both; the worker that is not the host applies the reload first. The
    oldest request, the host worker's, still gets the new endpoint first: it waits for its
    own worker's reload rather than letting a younger one pass."""
    base = str(tmp_path / "state")
    stores: list[WorkerStore] = []
    scheds: list[Scheduler] = []
    olds: list[Endpoint] = []
    for _ in range(2):
        olds.append(endpoint("a"))
        stores.append(WorkerStore(base, [olds[-1]], 100, 600, 1000, picker(LeastBusy())))
        await stores[-1].start()
        scheds.append(Scheduler([olds[-1]], stores[-1], LeastBusy(), 30.0))
    host, worker = stores
    assert host.is_host and not worker.is_host
    ctx = RouteContext(model="llama3:latest", api="", kind="")
    order: list[tuple[int, str]] = []

    async def one(i: int) -> None:
        lease = await scheds[i % 2].acquire(ctx)
        order.append((i, lease.endpoint.name))
        await asyncio.sleep(0.02)
        lease.release()

    def apply(w: int) -> None:  # what reload.apply does with the store and the scheduler
        olds[w].slots = 0
        new = endpoint("b")
        stores[w].update_endpoints([new, olds[w]])
        scheds[w].set_endpoints([new])

    try:
        hold = await scheds[0].acquire(ctx)
        tasks = []
        for i in range(N):
            tasks.append(asyncio.create_task(one(i)))
            await until(lambda n=i + 1: _queued(host, n), f"request {i} to queue")
        apply(1)
        await asyncio.sleep(0.1)
        assert order == []  # the new endpoint is kept for the oldest, whose worker has not reloaded
        apply(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert order == [(i, "b") for i in range(N)]
        assert host._coordinator is not None and host._coordinator.store.queue_length() == 0
        hold.release()
    finally:
        for store in reversed(stores):
            await store.close()


async def _queued(host: WorkerStore, n: int) -> bool:
    assert host._coordinator is not None
    return host._coordinator.store.queue_length() == n
