"""A client's faults are the client's, on real sockets: never counted against a backend, and
they do not hold a slot.

- A client that stops reading a stream: after `stream_idle_timeout` without write progress
  its connection is closed and the slot freed; the healthy endpoint is not blamed (before,
  the compiled relay took the stall for the backend's silence: a failure, a resumption on the
  next endpoint, which the client stalled too, and ejections; the Python relay held the slot
  as long as the client held the socket).
- A client that sends a large non-stream body and closes its socket: the slot is back within
  a second and the backend's request is cancelled (before, uvicorn had paused reading after
  64 KiB of body, so the router never saw the client's end of file: the socket sat in
  CLOSE-WAIT until the backend answered).
- A stream resumed elsewhere frees the dead endpoint's slot at the switch, not at its end.
On both relays where they apply."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.relay import pump as native
from test.helpers import endpoints, run_router
from test.test_backend_errors import metric, scrape
from test.test_relay import CHAT, WORDS

RELAYS = [True, False]  # native_relay


async def in_flight(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    page = await scrape(s, url)
    return {ep: metric(page, "nomyo_router_in_flight", endpoint=ep) for ep in ("m0", "m1")}


async def open_raw(url: str, request: bytes, rcvbuf: int = 0) -> socket.socket:
    """A plain socket that sent `request` (its receive buffer `rcvbuf` when > 0)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, request)
    return sock


def post(path: str, obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return (
        b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (path.encode(), len(data))
    ) + data


@pytest.mark.parametrize("native_relay", RELAYS)
@pytest.mark.parametrize("resume", [True, False])
async def test_a_client_that_stops_reading_is_cut_and_no_backend_is_blamed(native_relay, resume):
    idle = 0.5
    async with (
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=400_000) as a,
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=400_000) as b,
    ):
        cfg = {
            "endpoints": endpoints(a, b),
            "eject_after": 1,
            "stream_idle_timeout": idle,
            "native_relay": native_relay,
            "resume_streams": resume,
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            sock = await open_raw(r.url, post("/api/chat", CHAT), rcvbuf=4096)  # and never reads
            try:
                t0 = time.monotonic()
                seen_busy = False
                while time.monotonic() - t0 < idle + 10:
                    await asyncio.sleep(0.1)
                    busy = sum((await in_flight(s, r.url)).values())
                    seen_busy = seen_busy or busy > 0
                    if seen_busy and busy == 0:
                        break
                took = time.monotonic() - t0
                assert seen_busy and busy == 0, "the stalled stream kept its slot"
                assert took < idle + 5
                async with s.get(r.url + "/health") as h:
                    rows = {e["name"]: e for e in (await h.json())["endpoints"]}
                for name in ("m0", "m1"):
                    assert rows[name]["healthy"] is True
                    assert rows[name]["health"]["ejections"] == 0 and rows[name]["health"]["consecutive_failures"] == 0
                page = await scrape(s, r.url)
                assert metric(page, "nomyo_router_events_total", what="ejection") == 0
                assert metric(page, "nomyo_router_events_total", what="resumed") == 0
                for _ in range(50):  # the backend's stream was stopped too
                    if a.stats()["in_flight"] == b.stats()["in_flight"] == 0:
                        break
                    await asyncio.sleep(0.05)
                assert a.stats()["in_flight"] == b.stats()["in_flight"] == 0
                async with s.post(r.url + "/api/chat", json={**CHAT, "options": {"num_predict": 3}}) as resp:
                    assert resp.status == 200 and b'"done":true' in (await resp.read()).replace(b" ", b"")
            finally:
                sock.close()


async def test_a_client_that_sends_a_large_body_and_leaves_frees_its_slot_and_cancels_the_backend():
    async with (
        run_mock(ttft_ms=5000.0, tok_ms=0.0, tokens=8) as m,
        run_router({"endpoints": endpoints(m), "access_log": True}) as r,
        aiohttp.ClientSession() as s,
    ):
        done = []
        r.router.events.on_request_done(done.append)
        big = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x" * 300_000}]}
        sock = await open_raw(r.url, post("/api/chat", big))
        for _ in range(100):  # the request reached the backend
            if m.stats()["in_flight"] == 1:
                break
            await asyncio.sleep(0.02)
        assert m.stats()["in_flight"] == 1
        assert (await in_flight(s, r.url))["m0"] == 1
        sock.close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            await asyncio.sleep(0.02)
            if (await in_flight(s, r.url))["m0"] == 0 and m.stats()["in_flight"] == 0:
                break
        took = time.monotonic() - t0
        assert took < 1.0, f"the slot came back after {took:.2f}s"
        assert m.stats()["in_flight"] == 0 and not m.stats()["completed"]  # the backend's request was cancelled
        await asyncio.sleep(0.05)
        assert [(x.status, x.error) for x in done] == [(499, "client_gone")]
        assert r.router.health.snapshot()["m0"]["consecutive_failures"] == 0


@pytest.mark.parametrize("native_relay", RELAYS)
@pytest.mark.parametrize("fault", ["drop_rate", "error_rate"])  # a cut, the backend's error record
async def test_a_resumed_stream_frees_the_dead_endpoints_slot_at_the_switch(native_relay, fault):
    tokens = 60
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=tokens, **{fault: 1.0}) as dead,
        run_mock(ttft_ms=0.0, tok_ms=40.0, tokens=tokens) as slow,
    ):
        cfg = {
            "endpoints": endpoints(dead, slow, slots=4),
            "routing": "least_busy",
            "eject_after": 1000,
            "native_relay": native_relay,
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            for n in range(30):  # (least_busy breaks ties at random: until a stream starts on m0)
                body = {**CHAT, "messages": [{"role": "user", "content": f"hi {n}"}]}
                resp = await s.post(r.url + "/api/chat", json=body)
                if resp.headers["X-Router-Endpoint"] == "m0":
                    break
                resp.close()  # (not read to its end: 2.4 s at m1's pace) its slot back, then the next try
                for _ in range(250):
                    if await in_flight(s, r.url) == {"m0": 0, "m1": 0}:
                        break
                    await asyncio.sleep(0.02)
                else:
                    pytest.fail("the stream the client closed still holds its slot")
            else:
                pytest.fail("no stream started on m0")
            words: list[str] = []
            during = None
            async for line in resp.content:
                msg = json.loads(line)
                words += (msg.get("message") or {}).get("content", "").split()
                if during is None and len(words) >= tokens // 2 + 3:  # the continuation is flowing from m1
                    during = await in_flight(s, r.url)
            resp.release()
            after = await in_flight(s, r.url)
    assert words == [WORDS[i % 16] for i in range(tokens)]
    assert during == {"m0": 0, "m1": 1}  # m0's slot was back while the stream went on at m1
    assert after == {"m0": 0, "m1": 0}


def test_the_compiled_pump_tells_a_client_stall_from_a_silent_backend():
    if not native.AVAILABLE:
        pytest.skip("the C extension was not built (no compiler)")
    from nomyo_router.relay import _pump

    pump = _pump.Pump()
    up_r, up_w = socket.socketpair()
    cl_r, cl_w = socket.socketpair()
    cl_r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    cl_w.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    for x in (up_r, up_w, cl_r, cl_w):
        x.setblocking(False)
    try:
        h = pump.add(up_r.fileno(), cl_w.fileno(), b"\n", b"", 1 << 30)
        assert pump.blocked(h) is False  # nothing to write: a silence here is the backend's
        line = b'{"x":"' + b"y" * 1000 + b'"}\n'
        for _ in range(400):  # the client reads nothing: the pump ends up waiting for its socket
            try:
                up_w.send(b"%x\r\n%b\r\n" % (len(line), line))
            except BlockingIOError:
                break
            pump.run(16)
            if pump.blocked(h):
                break
        assert pump.blocked(h) is True
        pump.remove(h)
    finally:
        pump.close()
        for x in (up_r, up_w, cl_r, cl_w):
            x.close()
