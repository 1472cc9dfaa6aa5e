"""bench/slowgen, the compiled load side of bench/overload.py: it builds, its client counts
our mock's streams (and tells a short one), its backend sends the mock's bytes, and the
router relays its streams to its client. Real sockets; skipped where Go is not installed."""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import goload  # noqa: E402
import slowload  # noqa: E402
from mock import run_mock  # noqa: E402

from .helpers import run_router  # noqa: E402

pytestmark = pytest.mark.skipif(goload.go_tool() is None, reason="Go is not installed")


@pytest.fixture(scope="module")
def binary() -> str:
    return goload.build()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _load(binary: str, port: int, streams: int, tokens: int) -> slowload.Outcome:
    marks: list[str] = []
    out = await asyncio.to_thread(
        goload.run, binary, "127.0.0.1", port, streams, tokens, 0.2, 0.1, 1.0, 10.0, marks.append
    )
    assert marks == ["start", "end"]
    return out


async def test_client_counts_the_mocks_streams(binary: str) -> None:
    async with run_mock(ttft_ms=20, tok_ms=5, tokens=10, stream_tick_ms=5, parallel=1000, max_queue=1000) as m:
        out = await _load(binary, _port(m.url), 8, 10)
        stats = m.stats()
    assert len(out.requests) >= 8  # every user's closed loop ran more than once in the 1 s window
    assert [err for _, _, err in out.requests] == [None] * len(out.requests)
    assert all(ttft > 0 for _, ttft, _ in out.requests)
    assert out.lines == 11 * len(out.requests)
    assert stats["requests_total"] >= len(out.requests)
    assert out.cpu_s > 0 and out.wall_s > 0 and out.loop_lags and out.open_samples


async def test_client_tells_a_short_stream(binary: str) -> None:
    async with run_mock(ttft_ms=0, tok_ms=5, tokens=10, stream_tick_ms=5, parallel=1000, max_queue=1000) as m:
        out = await _load(binary, _port(m.url), 2, 12)  # it asks for 12 tokens; the mock has 10
    assert out.requests and {err for _, _, err in out.requests} == {"short"}


async def _exchange(port: int, tokens: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(slowload.request_bytes("127.0.0.1", port, tokens))
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        piece = await asyncio.wait_for(reader.read(65536), 5)
        assert piece, data
        data += piece
    writer.close()
    return re.sub(rb'"created_at": ?"[0-9T:.Z-]+"', b'"created_at":"-"', data)


@pytest.mark.parametrize("tokens", [5, 3])  # all of them, and fewer (num_predict: "length")
async def test_backend_sends_the_mocks_bytes(binary: str, tokens: int) -> None:
    async with run_mock(ttft_ms=20, tok_ms=5, tokens=5, stream_tick_ms=5, parallel=10, max_queue=10) as m:
        expected = await _exchange(_port(m.url), tokens)
    with goload.backend(binary, 20, 5, 5, 5) as b:
        got = await _exchange(b.port, tokens)
    assert got == expected
    assert expected.count(b'"done":false') == tokens


async def test_router_relays_the_backends_streams(binary: str) -> None:
    with goload.backend(binary, 20, 5, 10, 5) as b:
        async with run_router({"endpoints": [{"url": b.url, "name": "go", "max_concurrent": 100}]}) as r:
            out = await _load(binary, _port(r.url), 8, 10)
    assert len(out.requests) >= 8
    assert [err for _, _, err in out.requests] == [None] * len(out.requests)
    assert out.lines == 11 * len(out.requests)
    assert not any(math.isnan(ttft) for _, ttft, _ in out.requests)
