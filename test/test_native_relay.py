"""The compiled relay (relay/pump.py, _pump.c): after a stream's head and first chunk,
the rest of a chunked body goes from the backend's socket to the client's with no Python per
chunk. The bytes arrive whole and in order (whole records per chunk), the final counts are
kept, the backend's connection is reused, a paused client is waited for, a client that
leaves frees its slot, a cut resumes elsewhere, and a malformed or stalled body ends the
stream with an error record — as on the Python relay (test_relay.py).

A spy counts the streams `native.relay` really took over (it returns None when it does not,
and raises when the backend broke a stream it had)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from mock import run_mock
from nomyo_router import h1
from nomyo_router.relay import pump as native
from test.helpers import endpoints, run_router
from test.test_relay import CHAT, WORDS, RawClient, _ollama_lines, _text, read_with_a_stall

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension was not built (no compiler)")


@pytest.fixture
def taken(monkeypatch):
    seen = {"streams": 0, "broken": 0}
    relay = native.relay

    async def counting(*args, **kwargs):
        try:
            out = await relay(*args, **kwargs)
        except (h1.Cut, TimeoutError):
            seen["broken"] += 1  # taken over, then the backend broke it
            raise
        seen["streams"] += out is not None
        return out

    monkeypatch.setattr(native, "relay", counting)
    return seen


async def _chat(s: aiohttp.ClientSession, url: str, body: dict = CHAT) -> list[dict]:
    async with s.post(url + "/api/chat", json=body) as resp:
        assert resp.status == 200
        return _ollama_lines(await resp.read())


@pytest.mark.instruments  # (it counts the pool's connections)
@pytest.mark.parametrize("resume", [True, False])  # record-wise relay (continuation.py) / pass-through (proxy._relay)
async def test_a_stream_comes_through_whole_counted_and_its_connection_is_reused(taken, resume, monkeypatch):
    made = []
    connect = h1.Pool._connect

    async def counting(self, *args):
        made.append(1)
        return await connect(self, *args)

    monkeypatch.setattr(h1.Pool, "_connect", counting)
    async with (
        run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=300) as m,
        run_router({"endpoints": endpoints(m), "resume_streams": resume}) as r,
        aiohttp.ClientSession() as s,
    ):
        records = []
        r.router.events.on_request_done(records.append)
        direct = _text(await _chat(s, m.url))
        c = await RawClient.post(r.url, "/api/chat", CHAT)
        frames = []
        while (f := await c.frame()) is not None:
            frames.append(f)
        c.close()
        again = await _chat(s, r.url)
        idle = sum(len(pool._idle) for pool in r.router.proxy.upstream._pools.values())
    lines = _ollama_lines(b"".join(frames))
    assert _text(lines) == direct == [WORDS[i % 16] for i in range(300)]
    assert lines[-1]["done"] is True and not any(x.get("done") for x in lines[:-1])
    if resume:
        assert all(f.endswith(b"\n") for f in frames)  # whole records only
    assert _text(again) == direct
    assert taken["streams"] == 2
    assert [x.completion_tokens for x in records[-2:]] == [300, 300]  # counts from bytes taken in 3 KiB pieces
    assert idle == len(made)  # every connection made is back in the pool: none was closed


async def test_a_paused_client_gets_every_byte_in_order(taken):
    # ~5 MB to a client with a 4 KiB receive buffer that stalls for a second (a token every
    # 20 µs: reads end between chunks, so the pump takes the stream over and must wait). The
    # pump takes a stream only between two chunks with nothing unread and nothing queued for
    # the client: a busy machine can let those moments pass (the client's buffer full first),
    # the stream then staying in Python; so a stream is sent again, up to 5 times, until the
    # pump has had one, each of them checked whole.
    tokens = 40_000
    for _ in range(5):
        async with (
            run_mock(ttft_ms=0.0, tok_ms=0.02, tokens=tokens) as m,
            run_router({"endpoints": endpoints(m)}) as r,
        ):
            out = await read_with_a_stall(await RawClient.post(r.url, "/api/chat", CHAT, rcvbuf=4096))
        lines = _ollama_lines(out)
        assert _text(lines) == [WORDS[i % 16] for i in range(tokens)]
        assert lines[-1]["done"] is True and lines[-1]["eval_count"] == tokens
        if taken["streams"]:
            break
    assert taken["streams"] == 1


async def test_a_client_leaving_mid_stream_frees_its_slot_and_stops_the_backend(taken):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=20.0, tokens=500) as m,
        run_router({"endpoints": endpoints(m, slots=1)}) as r,
    ):
        c = await RawClient.post(r.url, "/api/chat", CHAT)
        for _ in range(5):
            assert await c.frame()
        c.close()
        for _ in range(100):
            await asyncio.sleep(0.02)
            snap = await r.router.store.snapshot()
            if snap["in_flight"].get("m0", 0) == 0 and m.stats()["in_flight"] == 0:
                break
        assert snap["in_flight"].get("m0", 0) == 0
        assert m.stats()["in_flight"] == 0  # the backend's connection was closed
        async with aiohttp.ClientSession() as s:  # the only slot serves the next stream
            lines = await _chat(s, r.url, {**CHAT, "options": {"num_predict": 3}})
        assert lines[-1]["done"] is True
        assert r.router.health.snapshot()["m0"]["ejections"] == 0
    assert taken["streams"] >= 1


async def test_a_stream_cut_mid_way_resumes_elsewhere(taken):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=80) as good,
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=80, drop_rate=1.0) as dropping,
    ):
        cfg = {"endpoints": endpoints(dropping, good, slots=4), "routing": "least_busy", "eject_after": 1000}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            direct = _text(await _chat(s, good.url))
            for lines in await asyncio.gather(*(_chat(s, r.url) for _ in range(6))):
                assert _text(lines) == direct and not any("error" in x for x in lines)
                assert sum(1 for x in lines if x.get("done")) == 1 and lines[-1]["eval_count"] == 80
    assert dropping.stats()["errors_injected"]["drop"] >= 1
    assert taken["broken"] >= 1 and taken["streams"] >= 1  # cut in the pump, resumed in Python (a seam)


async def _raw_backend(after_first: bytes, stall: bool = False):
    """An Ollama-shaped backend on a free port: GETs get `{}`; /api/chat gets a chunked head
    and one good record, then `after_first` (and then nothing, if `stall`; else it closes)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")), 0
                )
                await reader.readexactly(length)
                if not head.startswith(b"POST /api/chat"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                first = (
                    json.dumps(
                        {"model": "llama3", "message": {"role": "assistant", "content": "hi"}, "done": False}
                    ).encode()
                    + b"\n"
                )
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n" % (len(first), first)
                )
                await writer.drain()
                await asyncio.sleep(0.1)  # the router has relayed the first chunk: the pump has the socket
                writer.write(after_first)
                await writer.drain()
                if stall:
                    await asyncio.sleep(30)
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("case", ["malformed", "stalled", "closed"])
async def test_a_broken_body_ends_the_stream_with_an_error_record_and_frees_the_slot(taken, case):
    good = (
        json.dumps({"model": "llama3", "message": {"role": "assistant", "content": " there"}, "done": False}).encode()
        + b"\n"
    )
    after = {
        "malformed": b"zz\r\n",
        "stalled": b"%x\r\n%b\r\n" % (len(good), good),
        "closed": b"%x\r\n%b\r\n" % (len(good), good),
    }[case]
    server = await _raw_backend(after, stall=case == "stalled")
    port = server.sockets[0].getsockname()[1]
    eps = [
        {"url": f"http://127.0.0.1:{port}", "name": "raw", "type": "ollama", "models": ["llama3"], "max_concurrent": 1}
    ]
    try:
        async with (
            run_router({"endpoints": eps, "stream_idle_timeout": 0.5, "resume_streams": False}) as r,
            aiohttp.ClientSession() as s,
        ):
            lines = await asyncio.wait_for(_chat(s, r.url), 10)
            snap = await r.router.store.snapshot()
    finally:
        server.close()
    assert lines[0]["message"]["content"] == "hi"
    assert "error" in lines[-1] and not lines[-1].get("done")  # the stream says it broke
    if case != "malformed":
        assert lines[1]["message"]["content"] == " there"  # what came before the break went out
    assert snap["in_flight"].get("raw", 0) == 0
    assert taken["broken"] == 1 and taken["streams"] == 0  # the pump had it when it broke


async def test_native_relay_false_keeps_the_python_relay(taken):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=50) as m,
        run_router({"endpoints": endpoints(m), "native_relay": False}) as r,
        aiohttp.ClientSession() as s,
    ):
        lines = await _chat(s, r.url)
    assert _text(lines) == [WORDS[i % 16] for i in range(50)] and lines[-1]["done"] is True
    assert taken["streams"] == 0
