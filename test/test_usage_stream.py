"""GET /api/usage-stream read by a real SSE client (httpx streaming): a usage snapshot on
connecting and every second, an event when a request starts and when it finishes, live
in-flight per endpoint, token totals per model and client; the admin key; and a reader too
slow for the router is dropped, never buffered without bound."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from mock import run_mock
from nomyo_router.events import RequestRecord
from nomyo_router.ops.usage import stream as usage_stream
from test.helpers import endpoints, run_router

MSGS = [{"role": "user", "content": "hi"}]


async def events(resp: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any], float]]:
    """(event, data, arrival time) of an SSE response, as a browser's EventSource reads it."""
    kind, data = "message", []
    async for line in resp.aiter_lines():
        if line == "":
            if data:
                yield kind, json.loads("\n".join(data)), time.monotonic()
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


async def test_the_stream_tells_starts_finishes_in_flight_and_tokens():
    async with run_mock(ttft_ms=1200, tok_ms=0, tokens=8) as m:  # (a tick falls while it holds its slot)
        cfg = {"endpoints": endpoints(m), "client_keys": [{"name": "alice", "key": "alice-key-1"}]}
        async with run_router(cfg) as r:
            router = r.router
            assert router.events._start == []  # nobody watches: nothing registered
            async with httpx.AsyncClient(timeout=10) as c:
                async with c.stream(
                    "GET", r.url + "/api/usage-stream", headers={"Authorization": "Bearer alice-key-1"}
                ) as resp:
                    assert resp.status_code == 403  # a client key may not watch everyone
                headers = {"Authorization": "Bearer alice-key-1"}
                async with c.stream("GET", r.url + "/api/usage-stream") as resp:
                    assert resp.status_code == 401  # keys are required here
            cfg_admin = {
                "endpoints": endpoints(m),
                "admin_key": "admin-key-123",
                "client_keys": [{"name": "alice", "key": "alice-key-1"}],
            }
        async with run_router(cfg_admin) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                async with c.stream(
                    "GET", r.url + "/api/usage-stream", headers={"Authorization": "Bearer admin-key-123"}
                ) as resp:
                    assert resp.status_code == 200
                    assert resp.headers["content-type"].startswith("text/event-stream")
                    seen: list[tuple[str, dict[str, Any], float]] = []
                    ask = None
                    async for kind, data, at in events(resp):
                        seen.append((kind, data, at))
                        if ask is None:  # the first snapshot came: now a request
                            assert kind == "usage" and data["in_flight"] == {"m0": 0}
                            ask = asyncio.create_task(
                                c.post(
                                    r.url + "/api/chat",
                                    headers=headers,
                                    json={"model": "llama3", "messages": MSGS, "stream": False},
                                )
                            )
                        if kind == "usage" and data["tokens"]["by_client"].get("alice", {}).get("completion"):
                            break
                    assert (await ask).status_code == 200
    kinds = [k for k, _, _ in seen]
    start = next(d for k, d, _ in seen if k == "start")
    done = next(d for k, d, _ in seen if k == "done")
    assert kinds.index("start") < kinds.index("done")
    assert (start["model"], start["client"], start["route"]) == ("llama3", "alice", "/api/chat")
    assert done["request_id"] == start["request_id"] and done["endpoint"] == "m0" and done["status"] == 200
    assert done["completion_tokens"] == 8 and done["total_ms"] >= 1200
    busy = [d for k, d, _ in seen if k == "usage" and d["in_flight"]["m0"] == 1]
    assert busy, "a snapshot while the request held its slot shows it"
    last = seen[-1][1]
    assert last["tokens"]["by_model"]["llama3"] == {"prompt": done["prompt_tokens"], "completion": 8}
    assert last["tokens"]["by_client"]["alice"]["completion"] == 8
    ticks = [at for k, _, at in seen if k == "usage"]
    assert all(b - a < 1.5 for a, b in itertools.pairwise(ticks))  # at least every second (+ scheduling)


async def test_ticks_come_every_second_and_the_hooks_go_with_the_last_reader(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        async with httpx.AsyncClient(timeout=10) as c:
            async with c.stream("GET", r.url + "/api/usage-stream") as resp:
                ticks = []
                async for _kind, _, at in events(resp):
                    ticks.append(at)
                    if len(ticks) == 4:
                        break
            assert 2.5 < ticks[-1] - ticks[0] < 3.6
        for _ in range(100):
            if not r.router.usage_stream.subs:
                break
            await asyncio.sleep(0.02)
        assert not r.router.usage_stream.subs and r.router.events._start == []


async def test_a_reader_too_slow_is_dropped_and_nothing_grows(mock, monkeypatch):
    monkeypatch.setattr(usage_stream, "SEND_TIMEOUT", 1.0)
    async with run_router({"endpoints": endpoints(mock)}) as r:
        host, port = r.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(b"GET /api/usage-stream HTTP/1.1\r\nHost: localhost\r\n\r\n")  # and never read
        hub = r.router.usage_stream
        for _ in range(100):
            if hub.subs:
                break
            await asyncio.sleep(0.02)
        sub = next(iter(hub.subs))
        pushed, most = 0, 0
        rec = RequestRecord("x" * 64, "ollama", "/api/chat", "llama3" * 10, True, "client")
        while hub.subs and pushed < 200 * usage_stream.MAX_PENDING:  # far more than any buffer
            for _ in range(500):
                r.router.events.request_started(rec)
            pushed += 500 * 300
            most = max(most, sub.size)
            await asyncio.sleep(0.005)
        assert sub.dropped and most <= usage_stream.MAX_PENDING
        for _ in range(300):
            if not hub.subs:
                break
            await asyncio.sleep(0.02)
        assert not hub.subs and r.router.events._start == []
        sock.setblocking(False)
        got = 0
        try:
            while chunk := sock.recv(1 << 16):
                got += len(chunk)
        except BlockingIOError:
            pass
        sock.close()
        assert got < pushed / 4  # what reached the socket is what the buffers held, not all of it
        async with httpx.AsyncClient(timeout=10) as c:  # and the router serves on
            resp = await c.post(r.url + "/api/chat", json={"model": "llama3", "messages": MSGS, "stream": False})
            assert resp.status_code == 200


@pytest.mark.parametrize("keys", [False, True])
async def test_the_operator_route_is_open_only_on_an_open_router(mock, keys):
    cfg: dict[str, Any] = {"endpoints": endpoints(mock)}
    if keys:
        cfg["router_api_key"] = "router-key-1"
    async with run_router(cfg) as r:
        async with httpx.AsyncClient(timeout=10) as c:
            async with c.stream(
                "GET", r.url + "/api/usage-stream", headers={"Authorization": "Bearer router-key-1"} if keys else {}
            ) as resp:
                assert resp.status_code == (403 if keys else 200)


async def test_a_stopping_router_ends_the_stream_at_once(mock):
    kinds: list[str] = []

    async def read(url: str, connected: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=10) as c:
            async with c.stream("GET", url + "/api/usage-stream") as resp:
                async for kind, _, _ in events(resp):
                    kinds.append(kind)
                    connected.set()

    connected = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with run_router({"endpoints": endpoints(mock)}) as r:
        reader = asyncio.create_task(read(r.url, connected))
        await asyncio.wait_for(connected.wait(), 5)
        t0 = loop.time()
    stopped = loop.time() - t0  # (uvicorn here waits for every connection without a deadline)
    await asyncio.wait_for(reader, 5)  # the stream ended cleanly: the reader saw its end
    assert stopped < 2 and kinds[0] == "usage" and kinds[-1] == "end"
