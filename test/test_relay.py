"""The direct relay (relay/sinks.py): a stream's pieces written from the backend
connection's callback to the client's transport. What one read of the backend brought goes
out as one chunk; a paused client, a client that leaves, a backend that cuts the stream and a
translated stream all behave as on the ASGI path; the bytes arrive whole and in order.

The spies below wrap our protocol's `BodyWriter` (the real one still writes): they only
count, so a test can tell that the pieces really took the direct path. The compiled relay
(native_relay, test_native.py) is off here: it would take these streams over."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from mock import MockConfig, MockProcess, run_mock
from mock.text import WORDS
from nomyo_router.server.body_writer import BodyWriter
from test.helpers import endpoints, post_stream_raw, run_router

pytestmark = pytest.mark.instruments  # (it counts the direct writer's calls)

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def spy(monkeypatch):
    """Counts of the direct writer's writes and of the times it refused (client paused or gone)."""
    seen = {"writes": 0, "refused": 0}
    write, ready = BodyWriter.write, BodyWriter.ready

    def counting_write(self, data):
        seen["writes"] += 1
        write(self, data)

    def counting_ready(self):
        ok = ready(self)
        seen["refused"] += not ok
        return ok

    monkeypatch.setattr(BodyWriter, "write", counting_write)
    monkeypatch.setattr(BodyWriter, "ready", counting_ready)
    return seen


class RawClient:
    """One streamed request on a plain socket; reads the chunked body frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def post(cls, url: str, path: str, body: dict, rcvbuf: int = 0) -> RawClient:
        reader, writer = await post_stream_raw(url, path, body, rcvbuf)
        return cls(reader, writer)

    async def frame(self) -> bytes | None:
        """The next chunk of the body; None after the last."""
        size = int((await self.reader.readline()).strip(), 16)
        piece = await self.reader.readexactly(size + 2)
        assert piece.endswith(b"\r\n")
        return piece[:-2] if size else None

    def close(self) -> None:
        self.writer.close()


async def read_with_a_stall(c: RawClient) -> bytes:
    """The whole body, reading nothing for a second after the 50th chunk (the sender pushes back)."""
    out, n = bytearray(), 0
    while (f := await c.frame()) is not None:
        out += f
        n += 1
        if n == 50:
            await asyncio.sleep(1.0)
    c.close()
    return bytes(out)


def _ollama_lines(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.split(b"\n") if line]


def _text(lines: list[dict]) -> list[str]:
    return "".join((d.get("message") or {}).get("content", "") or d.get("response", "") for d in lines).split()


async def test_pieces_read_together_go_to_the_client_as_one_chunk(spy):
    # The mock runs in its own process; blocking this loop (the router's) for 0.3 s lets ~30
    # of its chunks pile up in the socket: the router's next read takes them all, and they
    # must leave as one chunk, not one write per piece (the cost that got af4e8d4 reverted).
    cfg = MockConfig(ttft_ms=0.0, tok_ms=10.0, tokens=60)
    with MockProcess(cfg) as m:
        async with run_router({"native_relay": False, "endpoints": endpoints(m)}) as r:
            c = await RawClient.post(r.url, "/api/chat", CHAT)
            frames = [await c.frame() for _ in range(3)]
            time.sleep(0.3)  # the router's loop too: the backend's chunks wait in its socket
            while (f := await c.frame()) is not None:
                frames.append(f)
            c.close()
    per_frame = [f.count(b"\n") for f in frames]
    assert all(f.endswith(b"\n") for f in frames)  # whole records only
    assert max(per_frame) >= 10, per_frame  # the piled-up pieces went out together
    lines = _ollama_lines(b"".join(frames))
    assert _text(lines) == [WORDS[i % 16] for i in range(60)]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 60
    assert not any(d.get("done") for d in lines[:-1])
    assert spy["writes"] >= 2  # the direct path wrote them


@pytest.mark.parametrize(
    "path,body", [("/api/chat", CHAT), ("/api/generate", {"model": "llama3", "prompt": "hi", "stream": True})]
)
async def test_a_paused_client_gets_every_byte_in_order(spy, path, body):
    # 40,000 tokens (~5 MB) to a client with a 4 KiB receive buffer that stalls for a second:
    # the router's transport pauses, the direct writer refuses, the ASGI path waits for the
    # drain, then the direct path takes over again.
    tokens = 40_000
    async with (
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=tokens) as m,
        run_router({"native_relay": False, "endpoints": endpoints(m)}) as r,
    ):
        out = await read_with_a_stall(await RawClient.post(r.url, path, body, rcvbuf=4096))
    lines = _ollama_lines(out)
    assert _text(lines) == [WORDS[i % 16] for i in range(tokens)]
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == tokens
    assert spy["writes"] > 0 and spy["refused"] > 0  # both paths were used


async def test_a_client_leaving_mid_stream_frees_its_slot_and_stops_the_backend(spy):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=20.0, tokens=500) as m,
        run_router({"native_relay": False, "endpoints": endpoints(m, slots=1)}) as r,
    ):
        c = await RawClient.post(r.url, "/api/chat", CHAT)
        for _ in range(5):
            assert await c.frame()
        assert spy["writes"] >= 3
        snap = await r.router.store.snapshot()
        assert snap["in_flight"].get("m0") == 1
        c.close()
        for _ in range(100):  # the slot comes back within a second or two, not after 10 s of stream
            await asyncio.sleep(0.02)
            snap = await r.router.store.snapshot()
            if snap["in_flight"].get("m0", 0) == 0 and m.stats()["in_flight"] == 0:
                break
        assert snap["in_flight"].get("m0", 0) == 0
        assert m.stats()["in_flight"] == 0  # the backend's stream was stopped (its connection closed)
        async with aiohttp.ClientSession() as s:  # the only slot serves the next request
            async with s.post(r.url + "/api/chat", json={**CHAT, "options": {"num_predict": 3}}) as resp:
                assert resp.status == 200
                lines = _ollama_lines(await resp.read())
        assert lines[-1]["done"] is True
        assert r.router.health.snapshot()["m0"]["ejections"] == 0


async def test_a_stream_cut_mid_way_resumes_elsewhere_through_the_direct_path(spy):
    # Slow enough (2 ms a token) that the pieces go through the direct writer before and after the cut.
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=80) as good,
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=80, drop_rate=1.0) as dropping,
    ):
        cfg = {
            "native_relay": False,
            "endpoints": endpoints(dropping, good, slots=4),
            "routing": "least_busy",
            "eject_after": 1000,
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            async with s.post(good.url + "/api/chat", json=CHAT) as resp:
                direct = _text(_ollama_lines(await resp.read()))

            async def one() -> list[dict]:
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                    assert resp.status == 200
                    return _ollama_lines(await resp.read())

            for lines in await asyncio.gather(*(one() for _ in range(6))):  # least_busy: both backends
                assert _text(lines) == direct and not any("error" in x for x in lines)
                assert sum(1 for x in lines if x.get("done")) == 1 and lines[-1]["eval_count"] == 80
        assert dropping.stats()["errors_injected"]["drop"] >= 1  # streams were really cut and resumed
        assert spy["writes"] > 40


async def test_openai_stream_without_usage_is_stripped_and_counted_on_the_direct_path(spy):
    # The router asks for usage on the client's behalf, takes the usage event out and counts it.
    body = {"model": "llama3", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with (
        run_mock(ttft_ms=0.0, tok_ms=3.0, tokens=40) as m,
        run_router({"native_relay": False, "endpoints": endpoints(m)}) as r,
    ):
        records = []
        r.router.events.on_request_done(records.append)
        async with aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                raw = await resp.read()
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and raw.count(b"[DONE]") == 1
    assert b'"usage"' not in raw  # not asked for: not sent
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text.split() == [WORDS[i % 16] for i in range(40)]
    assert records[-1].completion_tokens == 40 and records[-1].error is None
    assert spy["writes"] > 10


async def test_a_translated_stream_keeps_the_asgi_path(spy):
    async with run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=30) as m:
        eps = [{"url": m.url, "name": "oa", "type": "openai", "max_concurrent": 2}]
        async with run_router({"native_relay": False, "endpoints": eps}) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
                lines = _ollama_lines(await resp.read())
    assert _text(lines) == [WORDS[i % 16] for i in range(30)]
    assert lines[-1]["done"] is True
    assert spy["writes"] == 0  # SSE → NDJSON line by line: never written by the direct writer
