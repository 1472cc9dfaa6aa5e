"""Bounded resources per connection: head size and time, body idleness, and a cap
on connections. Raw sockets, since clients never misbehave this way on their own."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp

from test.helpers import endpoints, read_response, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def _send_big_head(url: str) -> bytes:
    """A request head of 160 KiB, never finished, then everything the router sends back until
    it closes. The router refuses it with our bytes still unread, so its close is a reset: the
    sending may fail, and reading ends in a reset. What it sent before is read all the same
    (the kernel hands out received data before it reports the reset), so the reply is seen
    whether the close came as a FIN or as a reset."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        try:
            sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nX-Big: ")
            for _ in range(40):  # 40 x 4 KiB
                sock.sendall(b"a" * 4096)
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused and closed before all of it was sent
        reply = b""
        try:
            while chunk := sock.recv(65536):  # (a router that never closes: socket timeout, a failure)
                reply += chunk
        except ConnectionResetError:
            pass  # the close, as a reset; the reply before it is in `reply`
        return reply


async def test_an_oversized_request_head_is_refused_and_closed(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        reply = await asyncio.to_thread(_send_big_head, r.url)  # (the router serves on this loop)
        assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


async def test_a_slow_request_head_is_timed_out(mock):
    async with run_router({"endpoints": endpoints(mock), "header_timeout": 0.5}) as r:
        reader, writer = await _open(r.url)
        t0 = time.monotonic()
        reply = asyncio.create_task(reader.read())  # returns when the router closes
        try:
            for ch in b"GET /api/tags HTTP/1.1\r\nHost: x":  # one byte every 0.1 s: 3 s in all
                if reply.done():
                    break
                writer.write(bytes([ch]))
                await writer.drain()
                await asyncio.sleep(0.1)
        except (ConnectionResetError, BrokenPipeError):
            pass
        data = await asyncio.wait_for(reply, 5)
        assert data.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 1.5


async def test_an_idle_body_is_cut_and_frees_nothing_it_did_not_take(mock):
    async with run_router({"endpoints": endpoints(mock), "body_idle_timeout": 0.5}) as r:
        reader, writer = await _open(r.url)
        writer.write(
            b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model":'
        )
        await writer.drain()
        await asyncio.wait_for(reader.read(), 5)  # closed by the router
        async with aiohttp.ClientSession() as s:  # and it still serves everyone else
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
            async with s.get(r.url + "/health") as h:
                body = await h.json()
        assert body["queue_length"] == 0 and all(e["in_flight"] == 0 for e in body["endpoints"])


async def test_connections_beyond_max_connections_get_503(mock):
    async with run_router({"endpoints": endpoints(mock), "max_connections": 4}) as r:
        held = [await _open(r.url) for _ in range(4)]
        await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as s:
            async with s.get(r.url + "/api/tags") as resp:
                assert resp.status == 503
        for _, w in held:
            w.close()


GET_TAGS = b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\n\r\n"


async def test_a_kept_alive_connection_lives_while_used_and_closes_when_idle(mock):
    """One deadline per connection, moved lazily (server/protocol.py): a connection used every 0.2 s
    outlives its 1 s keep-alive three times over; left idle, it is closed after about 1 s."""
    async with run_router({"endpoints": endpoints(mock)}, keep_alive=1.0) as r:
        reader, writer = await _open(r.url)
        for _ in range(15):  # 3 s of use
            writer.write(GET_TAGS)
            assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
            await asyncio.sleep(0.2)
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the router
        assert 0.6 < time.monotonic() - t0 < 3.0


async def test_the_next_request_on_a_kept_alive_connection_has_its_own_head_timeout(mock):
    async with run_router({"endpoints": endpoints(mock), "header_timeout": 0.5}, keep_alive=30) as r:
        reader, writer = await _open(r.url)
        writer.write(GET_TAGS)
        assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        writer.write(b"GET /api/tags HTTP/1.1\r\nHo")  # and never more
        t0 = time.monotonic()
        data = await asyncio.wait_for(reader.read(), 5)
        assert data.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2.0
