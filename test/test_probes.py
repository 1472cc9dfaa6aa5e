"""The orchestrator's probes on real sockets: /livez (the process answers) and /readyz (at
least one backend healthy), answered without a key and with a kubelet's `Host: <pod ip>:port`,
revealing nothing but ok / not ok; a Redis outage keeps the router ready (degraded by design);
a router still starting is alive and not ready."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import uvicorn

from mock import free_port, run_mock
from nomyo_router.app import RouterApp
from test.conftest import FAST, RedisServer
from test.helpers import endpoints, run_router

KEYS = {
    "admin_key": "admin-key-0123456789",
    "client_keys": [{"name": "app", "key": "client-key-0123456789"}],
}
FAST_HEALTH = {"health_interval": 0.1, "probe_interval_down": 0.1, "eject_after": 1}
KUBELET = {"Host": "10.244.1.7:12434", "User-Agent": "kube-probe/1.30", "Accept": "*/*"}


async def probe(s: aiohttp.ClientSession, url: str, path: str) -> tuple[int, bytes]:
    async with s.get(url + path, headers=KUBELET) as r:
        return r.status, await r.read()


async def wait_for(s: aiohttp.ClientSession, url: str, path: str, status: int) -> bytes:
    for _ in range(200):
        got, body = await probe(s, url, path)
        if got == status:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never answered {status}")


async def test_probes_need_no_key_and_say_only_ok_or_not():
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m), **KEYS, **FAST_HEALTH}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            async with s.get(r.url + "/api/tags") as refused:
                assert refused.status == 401  # the keys are on: only the probes are open
            assert await probe(s, r.url, "/livez") == (200, b"ok\n")
            assert await probe(s, r.url, "/readyz") == (200, b"ok\n")
            async with s.head(r.url + "/readyz", headers=KUBELET) as head:
                assert head.status == 200
            await m.close()  # the only backend goes away: not ready, still alive
            assert await wait_for(s, r.url, "/readyz", 503) == b"not ready\n"
            assert await probe(s, r.url, "/livez") == (200, b"ok\n")


async def test_a_redis_outage_keeps_the_router_ready(tmp_path):
    """Redis gone: each process serves under its own limits (degraded by design), so the pod
    stays in the Service and keeps answering."""
    async with run_mock(**FAST) as m:
        with RedisServer() as redis:
            cfg = {"endpoints": endpoints(m), "state": redis.url, "redis_timeout": 0.2, **FAST_HEALTH}
            async with run_router(cfg) as r, aiohttp.ClientSession() as s:
                assert await probe(s, r.url, "/readyz") == (200, b"ok\n")
                redis.stop()
                chat = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
                async with s.post(r.url + "/api/chat", json=chat) as served:
                    assert served.status == 200
                assert r.router.store.degraded
                assert await probe(s, r.url, "/readyz") == (200, b"ok\n")


async def test_a_starting_router_is_alive_and_not_ready():
    """Served before its lifespan has built the router (what a slow start looks like to the
    kubelet): alive, so it is not restarted; not ready, so it gets no traffic."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(RouterApp(), host="127.0.0.1", port=port, lifespan="off", log_level="error"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}"
            assert await probe(s, url, "/livez") == (200, b"ok\n")
            assert await probe(s, url, "/readyz") == (503, b"not ready\n")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
