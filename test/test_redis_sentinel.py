"""`state: redis+sentinel://…`: the router finds the master through Sentinel and follows a
failover. A real master, replica and `redis-sentinel` (from the distribution); the master is
killed, Sentinel promotes the replica, and the router, degraded meanwhile, shares its limits
again through the new master."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from mock import free_port, run_mock
from nomyo_router.state import redis_url
from test.conftest import RedisServer
from test.helpers import endpoints, run_router
from test.waits import until

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
SERVICE = "routerstate"


async def wait_for(check, within: float) -> None:
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < within, "condition not met in time"
        await asyncio.sleep(0.1)


def start_sentinel(directory: Path, master_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """One Sentinel (quorum 1) watching the master, quick to call it down and fail over."""
    exe = shutil.which("redis-sentinel")
    if exe is None:
        pytest.fail("redis-sentinel is not installed; `make test` installs it from the distribution")
    port = free_port()
    conf = directory / "sentinel.conf"  # (Sentinel rewrites its file: one of its own)
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndaemonize no\nsentinel resolve-hostnames no\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 400\n"
        f"sentinel failover-timeout {SERVICE} 2000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


async def test_the_router_follows_a_sentinel_failover(tmp_path):
    here = ("--dir", str(tmp_path))  # (a replica writes the master's data there)
    with RedisServer(here) as master:
        replica = RedisServer((*here, "--replicaof", "127.0.0.1", str(master.port)))
        with replica:
            admin_replica = aioredis.from_url(replica.url, socket_timeout=2)
            await wait_for(lambda: _linked(admin_replica), 10)
            sentinel, s_port = start_sentinel(tmp_path, master.port)
            ask = aioredis.Redis(host="127.0.0.1", port=s_port, socket_timeout=2)
            try:
                await wait_for(lambda: _knows_replica(ask), 15)
                state = f"redis+sentinel://127.0.0.1:{s_port}/{SERVICE}"
                async with (
                    run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2, parallel=64) as m,
                    run_router({"endpoints": endpoints(m), "state": state, "redis_timeout": 0.5}) as r,
                    aiohttp.ClientSession() as s,
                ):
                    store = r.router.store
                    statuses = [await _chat(s, r.url)]
                    assert not store.degraded
                    os.kill(master.proc.pid, signal.SIGKILL)  # the master dies
                    t_kill = time.monotonic()
                    statuses.append(await _chat(s, r.url))  # served meanwhile (degraded)
                    await wait_for(lambda: _promoted(ask, replica.port), 15)
                    followed = await until(lambda: not store.degraded, 10)
                    m.update(tok_ms=20.0, tokens=400)  # one stream of 8 s, held while Redis is read
                    held = await s.post(r.url + "/api/chat", json={**CHAT, "stream": True})
                    await held.content.readline()
                    promoted = aioredis.from_url(replica.url, socket_timeout=2)  # (the promotion closed the old)
                    leases = await promoted.zcard(f"{store.prefix}:lease:m0")
                    await promoted.aclose()
                    held.close()
                    m.update(tok_ms=0.0, tokens=2)
                    statuses.append(await _chat(s, r.url))
                    after = time.monotonic() - t_kill
                    print(f"\nfailover followed {after:.1f} s after the kill, {followed:.1f} s after the promotion")
            finally:
                sentinel.terminate()
                sentinel.wait(10)
                await ask.aclose()
                await admin_replica.aclose()
    assert statuses == [200, 200, 200]
    assert store.degraded_events == 1  # the outage, then shared again through the new master
    assert leases == 1  # the stream's slot is held in the promoted replica


async def _chat(s: aiohttp.ClientSession, url: str) -> int:
    async with s.post(url + "/api/chat", json=CHAT) as r:
        await r.read()
        return r.status


async def _linked(replica: aioredis.Redis) -> bool:
    return (await replica.info("replication")).get("master_link_status") == "up"


async def _knows_replica(sentinel: aioredis.Redis) -> bool:
    return len(await sentinel.sentinel_slaves(SERVICE)) >= 1


async def _promoted(sentinel: aioredis.Redis, port: int) -> bool:
    addr = await sentinel.sentinel_get_master_addr_by_name(SERVICE)
    return addr is not None and int(addr[1]) == port


def test_sentinel_urls_name_their_hosts_service_and_credentials():
    s = redis_url.parse_sentinel("redis+sentinel://u:p%40w@h1:26379,h2:26380/svc/3?sentinel_password=sp")
    assert (s.hosts, s.service, s.db, s.username, s.password) == ([("h1", 26379), ("h2", 26380)], "svc", 3, "u", "p@w")
    assert s.sentinel == {"password": "sp"}
    assert redis_url.address("redis+sentinel://u:p@h1:26379/svc") == "Sentinel service 'svc' at h1:26379"
    with pytest.raises(ValueError, match="service"):
        redis_url.parse_sentinel("redis+sentinel://h1:26379")
