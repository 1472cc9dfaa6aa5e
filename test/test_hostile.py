"""A hostile backend (test/hostile_backend.py) on real sockets: what it costs is bounded.

A stream record longer than `max_record_bytes` ends the client's stream with an error record
in its API's shape — on both relays (the Python `Records` and the compiled pump), Ollama's
NDJSON, OpenAI's SSE, and a translated stream; a whole answer the router must hold
(translation) beyond `max_response_bytes` is a 502 `response_too_large`, and one it passes
through is relayed as it comes. Each is the backend's failure (its health counts it), frees
the request's slot, and leaves another client's requests to a healthy backend served
meanwhile. Interim 1xx answers before the real one are skipped; a 101 nobody asked for is a
failure. Limits are small here (64 KiB against a 4 MiB record) to keep the tests fast."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest

from mock import run_mock
from nomyo_router import h1
from nomyo_router.relay import pump as native
from nomyo_router.relay.continuation import Sent
from nomyo_router.relay.sinks import Records
from test.conftest import FAST
from test.helpers import endpoints, run_router
from test.hostile_backend import MODEL, Hostile

LIMIT = 64 * 1024
BIG = 4 * 1024 * 1024
HI = [{"role": "user", "content": "hi"}]
# (the hostile backend's API, the path the client calls, the shape the client gets)
STREAMS = [
    ("ollama", "/api/chat", "ollama"),
    ("openai", "/v1/chat/completions", "openai"),
    ("openai", "/api/chat", "ollama"),
]  # the last: translated (SSE in, NDJSON out)
PASSED = [("ollama", "/api/chat"), ("openai", "/v1/chat/completions")]


@pytest.fixture
def pumped(monkeypatch):
    """How many streams the compiled pump ended for a record beyond the limit."""
    seen = {"long": 0}
    relay = native.relay

    async def counting(*args, **kwargs):
        try:
            return await relay(*args, **kwargs)
        except h1.TooLarge:
            seen["long"] += 1
            raise

    monkeypatch.setattr(native, "relay", counting)
    return seen


class Others:
    """Another client's steady requests to the healthy mock while the hostile one runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.done: list[tuple[int, float]] = []
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as s:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                async with s.post(
                    self.url + "/api/chat", json={"model": "llama3", "stream": False, "messages": HI}
                ) as r:
                    await r.read()
                self.done.append((r.status, time.perf_counter() - t0))
                await asyncio.sleep(0.005)

    async def finish(self) -> None:
        self.stop.set()
        await self.task
        assert self.done and all(status == 200 for status, _ in self.done)
        assert max(t for _, t in self.done) < 1.0  # never stalled behind the hostile stream


def _config(bad: Hostile, good, **extra) -> dict:
    # (context_routing off: learning the context windows would ask the hostile backend too,
    # and its answers are counted by what the tests send; whole answers asked whole: these
    # tests are about a hostile whole answer)
    return {
        "stream_whole_answers": False,
        "endpoints": [bad.endpoint(), *endpoints(good)],
        "max_record_bytes": LIMIT,
        "max_response_bytes": LIMIT,
        "context_routing": "off",
        **extra,
    }


def _body(path: str, stream: bool) -> dict:
    body = {"model": MODEL, "stream": stream, "messages": HI}
    if stream and path.startswith("/v1/"):
        body["stream_options"] = {"include_usage": True}  # nothing to strip: the pump may take the stream
    return body


def _events(raw: bytes, shape: str) -> list[dict]:
    if shape == "ollama":
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [json.loads(e[5:]) for e in raw.split(b"\n\n") if e.startswith(b"data:") and e[5:].strip() != b"[DONE]"]


async def _after(r, s: aiohttp.ClientSession) -> tuple[dict, dict]:
    """(the hostile endpoint's /health entry, its health state) once the request is done."""
    async with s.get(r.url + "/health") as h:
        entry = next(e for e in (await h.json())["endpoints"] if e["name"] == "hostile")
    return entry, r.router.health.snapshot()["hostile"]


@pytest.mark.parametrize("native_relay", [True, False])
@pytest.mark.parametrize("backend,path,shape", STREAMS)
async def test_a_record_longer_than_max_record_bytes_ends_the_stream(pumped, native_relay, backend, path, shape):
    async with (
        Hostile(backend, stream="long", size=BIG) as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good, native_relay=native_relay)) as r,
        aiohttp.ClientSession() as s,
    ):
        done = []
        r.router.events.on_request_done(done.append)
        others = Others(r.url)
        async with s.post(r.url + path, json=_body(path, True)) as resp:
            assert resp.status == 200
            raw = await asyncio.wait_for(resp.read(), 10)
        await others.finish()
        entry, health = await _after(r, s)
    events = _events(raw, shape)
    text = events[0]["message"]["content"] if shape == "ollama" else events[1]["choices"][0]["delta"]["content"]
    assert text == "hi"  # what came before the long record went out
    assert len(raw) < LIMIT and b"xxxx" not in raw  # ... and none of the long record
    err = events[-1]["error"]
    message = err if shape == "ollama" else err["message"]
    assert f"a stream record longer than max_record_bytes ({LIMIT} bytes)" in message
    if shape == "openai":
        assert err["type"] == "server_error"
    assert [x.error for x in done if x.model == MODEL] == ["record_too_large"]
    assert health["consecutive_failures"] == 1 and entry["in_flight"] == 0
    translated = backend != shape
    assert pumped["long"] == (native_relay and native.AVAILABLE and not translated)  # the pump bounded it


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("backend,path", PASSED)
async def test_a_whole_answer_larger_than_the_router_holds_is_relayed_as_it_comes(backend, path, chunked):
    async with (
        Hostile(backend, whole="big", size=BIG, chunked=chunked) as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good)) as r,
        aiohttp.ClientSession() as s,
    ):
        done = []
        r.router.events.on_request_done(done.append)
        others = Others(r.url)
        async with s.post(r.url + path, json=_body(path, False)) as resp:
            assert resp.status == 200
            assert resp.headers.get("Content-Length") == (None if chunked else str(BIG))
            raw = await asyncio.wait_for(resp.read(), 10)
        await others.finish()
        entry, health = await _after(r, s)
    answer = json.loads(raw)  # whole and intact
    assert len(raw) == BIG and (answer["message"] if backend == "ollama" else answer["choices"][0]["message"])
    mine = [x for x in done if x.model == MODEL]
    assert [(x.status, x.error, x.completion_tokens) for x in mine] == [(200, None, 7)]  # counted from its tail
    assert health["consecutive_failures"] == 0 and entry["in_flight"] == 0


async def test_a_whole_answer_the_router_must_translate_beyond_max_response_bytes_is_a_502():
    async with (
        Hostile("openai", whole="big", size=BIG) as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good)) as r,
        aiohttp.ClientSession() as s,
    ):
        others = Others(r.url)
        async with s.post(r.url + "/api/chat", json=_body("/api/chat", False)) as resp:
            status, body = resp.status, await resp.json()
        await others.finish()
        entry, health = await _after(r, s)
        async with s.get(r.url + "/metrics") as m:
            metrics = await m.text()
    assert status == 502
    assert body == {"error": f"the backend's answer is larger than max_response_bytes ({LIMIT} bytes)"}
    assert any(
        line.startswith("nomyo_router_requests_total{") and 'model="evil"' in line and 'status="502"' in line
        for line in metrics.splitlines()
    )
    assert health["consecutive_failures"] == 1 and entry["in_flight"] == 0


@pytest.mark.parametrize("backend,path", PASSED)
async def test_a_relayed_whole_answer_cut_midway_closes_the_clients_connection(backend, path):
    async with (
        Hostile(backend, whole="cut", size=BIG) as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good)) as r,
        aiohttp.ClientSession() as s,
    ):
        done = []
        r.router.events.on_request_done(done.append)
        async with s.post(r.url + path, json=_body(path, False)) as resp:
            assert resp.status == 200 and resp.headers["Content-Length"] == str(BIG)
            with pytest.raises(aiohttp.ClientPayloadError):  # never taken for the whole answer
                await asyncio.wait_for(resp.read(), 10)
        entry, health = await _after(r, s)
    assert [x.error for x in done if x.model == MODEL] == ["answer_cut"]
    assert health["consecutive_failures"] == 1 and entry["in_flight"] == 0


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("backend,path,shape", STREAMS)
async def test_interim_answers_before_the_real_one_are_skipped(backend, path, shape, stream):
    async with (
        Hostile(backend, stream="interim", whole="interim") as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good)) as r,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(r.url + path, json=_body(path, stream)) as resp:
            assert resp.status == 200
            raw = await resp.read()
        entry, health = await _after(r, s)
    if stream:
        events = _events(raw, shape)
        texts = (
            [e["message"]["content"] for e in events]
            if shape == "ollama"
            else [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
        )
        assert "".join(t or "" for t in texts) == "hi there" and not any("error" in e for e in events)
    else:
        answer = json.loads(raw)
        assert (answer["done"] is True) if shape == "ollama" else answer["choices"][0]["finish_reason"] == "stop"
    assert bad.served == 1 and health["consecutive_failures"] == 0 and entry["in_flight"] == 0


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("backend,path,shape", STREAMS[:2])
async def test_a_protocol_switch_nobody_asked_for_is_a_backend_failure(backend, path, shape, stream):
    async with (
        Hostile(backend, stream="switch", whole="switch") as bad,
        run_mock(**FAST) as good,
        run_router(_config(bad, good)) as r,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(r.url + path, json=_body(path, stream)) as resp:
            status, body = resp.status, await resp.json()
        entry, health = await _after(r, s)
    assert status == 502
    message = body["error"] if shape == "ollama" else body["error"]["message"]
    assert "HTTP 101" in message
    assert health["consecutive_failures"] == 1 and entry["in_flight"] == 0


# ---- Records, without sockets ---------------------------------------------------------------


def _split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 40))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


class Reference:
    """What Records did before it was bounded: the waiting bytes and each new piece joined,
    and all of it searched again, per read (quadratic for a long record)."""

    def __init__(self, sep: bytes) -> None:
        self.sep, self.pending = sep, b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pending + chunk
        end = data.rfind(self.sep)
        if end < 0:
            self.pending = data
            return b""
        end += len(self.sep)
        out, self.pending = data[:end], data[end:]
        return out


@pytest.mark.parametrize("sep", [b"\n", b"\n\n"])
def test_records_come_out_whole_however_the_reads_split_them(sep):
    rng = random.Random(7)
    for _ in range(500):
        recs = [
            b"r%d" % i + b"x" * rng.randint(0, 30) + (b"\n" if sep == b"\n\n" and rng.random() < 0.3 else b"")
            for i in range(rng.randint(1, 12))
        ]
        data = b"".join(r + sep for r in recs) + b"tail"
        whole, ref = Records(sep, None, Sent(), None), Reference(sep)
        for piece in _split(data, rng):
            got = whole.feed(piece)
            assert got == ref.feed(piece) and (not got or got.endswith(sep))
            assert whole.pending == ref.pending


def test_a_record_beyond_the_limit_raises_and_nothing_is_lost_before_it():
    whole = Records(b"\n", None, Sent(), None, limit=1000)
    assert whole.feed(b"ok\n" + b"a" * 600) == b"ok\n"
    with pytest.raises(h1.TooLarge):
        whole.feed(b"a" * 600)
    with pytest.raises(h1.TooLarge):  # nothing changed: the same piece raises again
        whole.feed(b"a" * 600)
    assert whole.pending == b"a" * 600
    assert whole.feed(b"b" * 300 + b"\n") == b"a" * 600 + b"b" * 300 + b"\n"  # 901 bytes: within
    assert whole.feed(b"c" * 700) == b""
    with pytest.raises(h1.TooLarge):  # it ends in this piece, but is 1,201 bytes long in all
        whole.feed(b"d" * 500 + b"\n")


def test_a_long_record_costs_time_in_proportion_to_its_length():
    whole = Records(b"\n", None, Sent(), None, limit=64 * 1024 * 1024)
    piece = b"x" * 4096
    t0 = time.perf_counter()
    for _ in range(8192):  # 32 MiB without a separator (re-scanning it per read: minutes)
        assert whole.feed(piece) == b""
    assert len(whole.feed(b"\n")) == 32 * 1024 * 1024 + 1
    assert time.perf_counter() - t0 < 1.0
