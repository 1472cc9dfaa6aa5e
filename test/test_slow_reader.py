"""A relayed stream arrives complete and in order when the client reads slowly (the
client's transport pauses, the backend's is paused in turn), with our protocol and
without it."""

from __future__ import annotations

import asyncio
import json

import pytest

from mock import run_mock
from mock.text import WORDS
from test.helpers import endpoints, post_stream_raw, run_router

TOKENS = 40_000  # ~5 MB: more than the kernel buffers, so the router's transport pauses
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _raw_stream(url: str, path: str, body: dict, stall_at: int = 0) -> bytes:
    """The de-chunked body of a stream, read by a client that stalls for a second after `stall_at` pieces."""
    reader, writer = await post_stream_raw(url, path, body, rcvbuf=4096)  # so the router's writes pile up
    out = bytearray()
    n = 0
    while True:
        size = int((await reader.readline()).strip(), 16)
        piece = await reader.readexactly(size + 2)
        if size == 0:
            break
        out += piece[:-2]
        n += 1
        if n == stall_at:
            await asyncio.sleep(1.0)  # the router's writes to us pile up meanwhile
    writer.close()
    return bytes(out)


@pytest.mark.parametrize("http", ["nomyo_router.server.protocol:GuardedHttpToolsProtocol", "httptools"])
@pytest.mark.parametrize(
    "path,body", [("/api/chat", CHAT), ("/api/generate", {"model": "llama3", "prompt": "hi", "stream": True})]
)
async def test_relayed_stream_is_complete_and_in_order_with_a_slow_client(http, path, body):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=TOKENS) as m,
        run_router({"endpoints": endpoints(m)}, http=http) as r,
    ):
        raw = await _raw_stream(r.url, path, body, stall_at=100)
    lines = [json.loads(line) for line in raw.split(b"\n") if line]
    text = "".join((d.get("message") or {}).get("content", "") or d.get("response", "") for d in lines)
    words = text.split()
    assert len(words) == TOKENS and words[:3] == ["lorem", "ipsum", "dolor"]
    assert words == [WORDS[i % len(WORDS)] for i in range(TOKENS)]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == TOKENS
    assert not any(d.get("done") for d in lines[:-1])
