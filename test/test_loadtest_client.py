"""The load tester's requests through the router's HTTP/1.1 client, against a server on a real
socket that writes a chunked stream in awkward pieces: time to first token is taken at the
first non-empty content (not at the head, nor at the role-only first chunk), lines split
across chunks and chunk-size lines split across writes are put back together, the
connection is kept for the next request, and a server that goes silent after its head ends
the request at its deadline."""

from __future__ import annotations

import asyncio
import json
import time

from loadtest.client import Client, send

CONTENT_AFTER_S = 0.2  # the server holds the first token back this long after the head


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _line(content: str, done: bool = False, **more: object) -> bytes:
    return json.dumps({"message": {"role": "assistant", "content": content}, "done": done, **more}).encode() + b"\n"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(_chunk(_line("")))  # the role-only chunk comes with the head: no token yet
    await writer.drain()
    if path == b"/hang":
        await reader.read()  # until the client, at its deadline, closes the connection
        return
    await asyncio.sleep(CONTENT_AFTER_S)
    first = _chunk(_line("lorem "))
    writer.write(first[:1])  # the chunk-size line split across two writes
    await writer.drain()
    await asyncio.sleep(0.01)
    writer.write(first[1:])
    second = _line("ipsum ")
    writer.write(_chunk(second[:9]))  # one JSON line across two chunks
    await writer.drain()
    await asyncio.sleep(0.01)
    writer.write(_chunk(second[9:]) + _chunk(_line("", done=True, eval_count=2)) + b"0\r\n\r\n")
    await writer.drain()


async def test_ttft_from_a_chunked_stream_in_pieces_and_a_deadline():
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"Content-Length"
                )
                await reader.readexactly(length)
                await _answer(reader, writer, head.split(b" ", 2)[1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = Client(f"http://127.0.0.1:{port}")
    try:
        req = client.build("/api/chat", b'{"model":"m","stream":true}', {"X-Session": "s1"})
        for _ in range(2):
            r = await send(client, req, "ollama", "chat", True, 5.0, time.perf_counter())
            assert r.ok, r.error
            assert r.status == 200
            assert CONTENT_AFTER_S <= r.ttft < r.latency  # the first token, not the head's chunk
            assert r.out_tokens == 2  # the final chunk's eval_count
            assert len(r.itl) == 1 and r.itl[0] > 0  # two content chunks, one gap
        assert connections == 1  # kept alive for the second request

        hang = client.build("/hang", b"{}", {})
        r = await send(client, hang, "ollama", "chat", True, 0.3, time.perf_counter())
        assert r.error == "timeout" and r.status == 200 and r.ttft is None
        assert r.latency >= 0.3  # (nothing but the deadline ends it: the server waits for the close)
    finally:
        client.close()
        server.close()
        await server.wait_closed()
