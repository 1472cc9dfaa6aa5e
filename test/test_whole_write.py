"""A whole answer written by our protocol in one go (`BodyWriter.whole`) is what uvicorn's
own `send` writes for the same ASGI messages: the same status line, the same headers in the
same order, the same body framing, and `connection: close` honoured. Plain uvicorn's
protocol (`http="httptools"`: no writer in the scope, every byte through ASGI) is the
reference. A spy counts the writer's calls, so a test can tell the direct path was taken."""

from __future__ import annotations

import asyncio
import json

import pytest

from nomyo_router.server.body_writer import BodyWriter
from test.helpers import endpoints, read_response, run_router

pytestmark = pytest.mark.instruments  # (it counts the direct writer's calls)

BODY = json.dumps({"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}).encode()
DYNAMIC = {b"date", b"x-request-id", b"x-router-queue-ms", b"x-router-overhead-ms", b"x-router-worker"}


@pytest.fixture
def wholes(monkeypatch):
    seen = {"whole": 0}
    whole = BodyWriter.whole

    def counting(self, status, headers, body):
        done = whole(self, status, headers, body)
        seen["whole"] += done
        return done

    monkeypatch.setattr(BodyWriter, "whole", counting)
    return seen


async def _exchange(url: str, close: bool) -> tuple[bytes, list[tuple[bytes, bytes]], bytes, bool]:
    """(status line, headers, body, closed after) of one raw POST /api/chat."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + (b"Connection: close\r\n" if close else b"")
        + b"Content-Length: %d\r\n\r\n" % len(BODY)
        + BODY
    )
    status, headers, body = await read_response(reader)
    try:  # closed: the server ended the connection (read gives b""); open: nothing comes in 0.5 s
        closed = await asyncio.wait_for(reader.read(1), 2 if close else 0.5) == b""
    except TimeoutError:
        closed = False
    writer.close()
    return status, headers, body, closed


@pytest.mark.parametrize("close", [False, True])
async def test_a_whole_answer_is_written_as_uvicorn_writes_it(mock, wholes, close):
    seen = []
    for http in ("httptools", "nomyo_router.server.protocol:GuardedHttpToolsProtocol"):
        async with run_router({"endpoints": endpoints(mock)}, http=http) as r:
            seen.append(await _exchange(r.url, close))
    (s1, h1, b1, c1), (s2, h2, b2, c2) = seen
    assert wholes["whole"] == 1  # our protocol took the direct path, once
    assert s1 == s2 == b"HTTP/1.1 200 OK"
    assert [n for n, _ in h1] == [n for n, _ in h2]
    assert [(n, v) for n, v in h1 if n not in DYNAMIC] == [(n, v) for n, v in h2 if n not in DYNAMIC]
    assert (b"connection", b"close") in h2 if close else all(n != b"connection" for n, _ in h2)
    assert c1 == c2 == close  # closed after the answer only when asked
    assert json.loads(b1).keys() == json.loads(b2).keys() and json.loads(b2)["done"] is True
