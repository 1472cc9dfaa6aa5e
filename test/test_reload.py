"""Config reload without a restart: SIGHUP and POST /admin/reload, one worker and several."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import pytest
import yaml

from mock import MockConfig, MockProcess
from nomyo_router.config import CONFIG_ENV, load_config
from test.helpers import run_router
from test.router_proc import router_workers
from test.waits import until

ADMIN = {"Authorization": "Bearer admin-key-123456"}
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


def write(path: str, cfg: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(cfg, f)
    os.replace(tmp, path)  # an editor's atomic save: a reader never sees half a file


async def test_admin_reload_adds_removes_and_rejects(mock, mock2, tmp_path, monkeypatch):
    path = str(tmp_path / "config.yaml")
    base = {"admin_key": "admin-key-123456", "usage_db": None}
    write(path, {**base, "endpoints": [{"url": mock.url, "name": "a", "max_concurrent": 2}]})
    monkeypatch.setenv(CONFIG_ENV, path)
    async with run_router(load_config(path)) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/admin/reload") as resp:
            assert resp.status == 403  # the router is open, but reloading needs the admin key
        write(path, {**base, "endpoints": [{"url": mock2.url, "name": "b", "max_concurrent": 3}], "max_queue": 7})
        async with s.post(r.url + "/admin/reload", headers=ADMIN) as resp:
            body = await resp.json()
            assert resp.status == 200, body
        assert body["added"] == ["b"] and body["removed"] == ["a"] and body["restart_needed"] == ["max_queue"]
        async with s.post(r.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "b"
        async with s.get(r.url + "/health", headers=ADMIN) as resp:  # (details: the admin key)
            assert [e["name"] for e in (await resp.json())["endpoints"]] == ["b"]
        with open(path, "w") as f:
            f.write("endpoints: [{url: 'not a url'}]\n")
        async with s.post(r.url + "/admin/reload", headers=ADMIN) as resp:
            assert resp.status == 400 and "url" in (await resp.json())["error"]
        async with s.post(r.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "b"  # the old config stays


async def stream_until(url: str, stop: asyncio.Event, log: list[tuple[float, str, bool, float]]) -> None:
    """One client: streaming chats back to back; (start time, endpoint, complete, time its answer's
    head arrived) each. (A request may reach the router well after its start time when this
    loop is slow: the head's time is when the router had surely chosen its endpoint.)"""
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            t = time.monotonic()
            try:
                async with s.post(url + "/api/chat", json={**CHAT, "stream": True}) as resp:
                    head = time.monotonic()
                    lines = (await resp.read()).splitlines()
                    ok = resp.status == 200 and json.loads(lines[-1]).get("done") is True
                    log.append((t, resp.headers.get("X-Router-Endpoint", ""), ok, head))
            except (aiohttp.ClientError, ValueError, IndexError):
                log.append((t, "", False, time.monotonic()))


@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_under_streaming_load_drops_nothing(workers, tmp_path):
    slow = MockConfig(ttft_ms=20, tok_ms=10, tokens=20, parallel=64)
    with MockProcess(slow) as a, MockProcess(slow) as b, MockProcess(slow) as c:

        def cfg(*eps: tuple[str, MockProcess]) -> dict:
            return {"endpoints": [{"url": m.url, "name": n, "max_concurrent": 16} for n, m in eps], "usage_db": None}

        with router_workers(cfg(("a", a), ("b", b)), workers) as (url, proc):
            path = proc.args[proc.args.index("--config") + 1]
            stop, log = asyncio.Event(), []
            clients = [asyncio.create_task(stream_until(url, stop, log)) for _ in range(32)]
            await until(lambda: {x[1] for x in log} >= {"a", "b"}, 10)  # (both endpoints serve)
            write(path, cfg(("b", b), ("c", c)))
            hup = time.monotonic()
            os.kill(proc.pid, signal.SIGHUP)
            await asyncio.sleep(2.5)  # past the 2 s the new config has to take over, under load
            stop.set()
            await asyncio.gather(*clients)
            assert proc.poll() is None  # SIGHUP did not kill it
            with open(path, "w") as f:
                f.write("endpoints: []\n")  # invalid: rejected, the running config stays
            os.kill(proc.pid, signal.SIGHUP)
            await asyncio.sleep(0.5)
            async with aiohttp.ClientSession() as s, s.get(url + "/health") as resp:
                assert [e["name"] for e in (await resp.json())["endpoints"]] == ["b", "c"]
    failed = [x for x in log if not x[2]]
    assert not failed, f"{len(failed)} of {len(log)} requests failed"
    first_c = min(t for t, ep, _, _ in log if ep == "c")
    print(
        f"workers={workers}: {len(log)} requests, {len(failed)} failed; the new endpoint answered a request "
        f"sent {first_c - hup:.3f} s after SIGHUP"
    )
    assert first_c - hup <= 2.0
    assert not [x for x in log if x[1] == "a" and x[0] > hup + 2.0]  # removed: nothing new goes there
    assert {ep for _, ep, _, head in log if head < hup} == {"a", "b"}  # answered before the SIGHUP
