"""The hot path's HTTP/1.1 client (h1/pool.py) against real sockets: a raw asyncio server
that answers exactly as each case needs (what a backend may do that the mock does not)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from nomyo_router import h1
from nomyo_router.domain import Endpoint

T = aiohttp.ClientTimeout(sock_connect=2, sock_read=2)
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )  # a GET has none
    return head + await r.readexactly(length)


async def serve(handler: Handler) -> tuple[asyncio.Server, Endpoint, list[int]]:
    """A server calling `handler(reader, writer, n)` for the n-th request of each connection."""
    connections: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        connections.append(1)
        n = 0
        try:
            while True:
                await read_request(r)
                n += 1
                await handler(r, w, n)
                if w.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ep = Endpoint(name="raw", url=f"http://127.0.0.1:{port}", slots=4)
    ep.headers = {"Content-Type": "application/json"}
    return server, ep, connections


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def test_a_kept_alive_connection_the_backend_dropped_is_replaced_transparently():
    async def handler(r, w, n):
        if n == 1:
            w.write(OK)
        else:
            w.close()  # the backend dropped the idle connection just as we reused it

    server, ep, conns = await serve(handler)
    up = h1.Upstream()
    for _ in range(3):
        resp = await up.post(ep, "/x", b"{}", T)
        assert resp.status == 200 and await resp.read() == b"{}"
        resp.release()
    assert len(conns) == 3  # each reuse failed before any byte and went out again on a fresh one
    up.close()
    server.close()


async def test_bodies_by_length_chunks_and_connection_close():
    async def handler(r, w, n):
        if n == 1:
            w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        else:
            w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
            await w.drain()
            w.close()

    server, ep, conns = await serve(handler)
    up = h1.Upstream()
    resp = await up.post(ep, "/x", b"{}", T)
    assert await resp.content.readline() == b"hello world"  # no newline: the whole body
    resp.release()
    resp = await up.post(ep, "/x", b"{}", T)  # the same connection (chunked body ended cleanly)
    assert await resp.read() == b"until the end"
    resp.release()
    assert len(conns) == 1
    up.close()
    server.close()


async def test_a_cut_body_and_a_stalled_one_raise_what_the_proxy_handles():
    calls: list[int] = []

    async def handler(r, w, n):
        calls.append(n)
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab\n\r\n"
        )
        await w.drain()
        if len(calls) == 1:
            w.transport.abort()  # cut mid-stream
        # else: stall

    server, ep, _ = await serve(handler)
    up = h1.Upstream()
    resp = await up.post(ep, "/x", b"{}", T)
    assert resp.headers.get("Content-Type") == "application/x-ndjson"
    assert await resp.content.readany() == b"ab\n"
    with pytest.raises(h1.Cut):
        await resp.content.readany()
    resp.close()
    resp = await up.post(ep, "/x", b"{}", aiohttp.ClientTimeout(sock_connect=2, sock_read=0.3))
    assert await resp.content.readany() == b"ab\n"
    with pytest.raises(TimeoutError):
        await resp.content.readany()
    resp.close()
    up.close()
    server.close()


async def test_a_request_bound_covers_the_head_and_reads_until_unbound():
    """`within` (the proxy's first-byte deadline): the head and each read before `unbound()`
    must come in time, whatever sock_read allows; after it, only sock_read bounds reads."""
    calls: list[int] = []

    async def handler(r, w, n):
        calls.append(n)
        if len(calls) == 1:
            return  # no head at all (the connection stays open)
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab\n\r\n")
        await w.drain()
        await asyncio.sleep(0.6)
        w.write(b"3\r\ncd\n\r\n0\r\n\r\n")

    server, ep, _ = await serve(handler)
    up = h1.Upstream()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError):
        await up.post(ep, "/x", b"{}", T, within=0.3)  # sock_read 2 s, the bound 0.3 s
    assert 0.25 < loop.time() - t0 < 1.5
    resp = await up.post(ep, "/x", b"{}", T, within=0.3)
    assert await resp.content.readany() == b"ab\n"
    with pytest.raises(TimeoutError):  # the next read is still bound
        await resp.content.readany()
    resp.close()
    resp = await up.post(ep, "/x", b"{}", T, within=0.3)
    assert await resp.content.readany() == b"ab\n"
    resp.unbound()
    assert await resp.content.readany() == b"cd\n"  # 0.6 s later: sock_read only
    assert await resp.content.readany() == b""
    resp.release()
    up.close()
    server.close()


async def test_nothing_listening_is_unreachable():
    ep = Endpoint(name="none", url="http://127.0.0.1:9", slots=1)
    with pytest.raises(h1.Unreachable):
        await h1.Upstream().post(ep, "/x", b"{}", T)


async def test_fetch_gets_a_whole_answer_on_the_pooled_connection_within_a_total_timeout():
    heads: list[bytes] = []
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            while True:
                heads.append(await r.readuntil(b"\r\n\r\n"))
                if len(heads) != 3:
                    w.write(OK)
                else:  # the third: headers, then nothing more
                    w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab")
        except (asyncio.IncompleteReadError, ConnectionError):
            w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    ep = Endpoint(name="raw", url=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/base", slots=1)
    ep.headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
    up = h1.Upstream()
    assert await up.fetch(ep, "/api/tags", total=2) == (
        200,
        {"content-type": "application/json", "content-length": "2"},
        b"{}",
    )
    status, _, body = await up.fetch(ep, "/api/show", b'{"model":"m"}', total=2)
    assert (status, body) == (200, b"{}")
    get = heads[0].decode().lower()
    assert get.startswith("get /base/api/tags http/1.1\r\n") and "authorization: bearer k" in get
    assert "content-length" not in get and "content-type" not in get  # no body, no content headers
    assert heads[1].decode().lower().startswith("post /base/api/show ") and len(conns) == 1  # kept alive
    with pytest.raises(TimeoutError):
        await up.fetch(ep, "/api/ps", total=0.3)
    assert (await up.fetch(ep, "/api/ps", total=2))[2] == b"{}"
    assert len(conns) == 2  # the timed-out connection was closed, not reused with a half-read body
    up.close()
    server.close()
