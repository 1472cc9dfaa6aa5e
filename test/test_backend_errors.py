"""A backend that fails under a 200 (relay/error_record.py), on real sockets: the mock's
`error_rate` fault sends what Ollama sends when its model runner crashes mid-stream — an
`{"error": ...}` record, then the stream's end (OpenAI API: `data: {"error": {...}}`, then
`[DONE]`, as vLLM) — or an error object as a whole 200 answer.

Such a stream is cut at the record: resumed on another endpoint (the client gets the whole
text and never the record), else the record is what the client gets last, and nothing after
it. Either way it is the endpoint's failure (its health, `nomyo_router_events_total
{what="error_record"}`); a client that got the record is a failed request: `status="502"`,
error `backend_error_record`, in /metrics, the access record and usage. On both relays (the
Python one and the compiled pump)."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.events import RequestRecord
from nomyo_router.h1.errors import ErrorRecord
from nomyo_router.relay import pump as native
from test.helpers import endpoints, run_router
from test.test_relay import WORDS

TOKENS = 40
CRASH = "llama runner process has terminated: signal: killed"
PATHS = [("/api/chat", "ollama"), ("/v1/chat/completions", "openai")]


def body(path: str, n: int = 0, stream: bool = True) -> dict:
    return {"model": "llama3", "stream": stream, "messages": [{"role": "user", "content": f"hi {n}"}]}


def records(raw: bytes, shape: str) -> list[dict]:
    if shape == "ollama":
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [json.loads(e[5:]) for e in raw.split(b"\n\n") if e.startswith(b"data:") and e[5:].strip() != b"[DONE]"]


def text(recs: list[dict], shape: str) -> list[str]:
    if shape == "ollama":
        return "".join((r.get("message") or {}).get("content", "") for r in recs).split()
    return "".join(((r.get("choices") or [{}])[0].get("delta") or {}).get("content") or "" for r in recs).split()


def metric(page: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for m in re.finditer(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", page, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


async def scrape(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url + "/metrics") as resp:
        return await resp.text()


@pytest.fixture
def pumped(monkeypatch):
    """How many streams the compiled pump ended at the backend's error record."""
    seen = {"error": 0}
    relay = native.relay

    async def counting(*args, **kwargs):
        try:
            return await relay(*args, **kwargs)
        except ErrorRecord:
            seen["error"] += 1
            raise

    monkeypatch.setattr(native, "relay", counting)
    return seen


@pytest.mark.parametrize("native_relay", [True, False])
@pytest.mark.parametrize("path,shape", PATHS)
async def test_an_error_record_mid_stream_is_resumed_on_another_endpoint(pumped, native_relay, path, shape):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=TOKENS, error_rate=1.0) as bad,
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=TOKENS) as good,
    ):
        cfg = {
            "endpoints": endpoints(bad, good, slots=4),
            "routing": "least_busy",
            "eject_after": 1000,
            "native_relay": native_relay,
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            done: list[RequestRecord] = []
            r.router.events.on_request_done(done.append)
            for n in range(30):  # (least_busy breaks ties at random: until a stream starts on m0)
                async with s.post(r.url + path, json=body(path, n)) as resp:
                    assert resp.status == 200
                    raw = await resp.read()
                    if resp.headers["X-Router-Endpoint"] == "m0":
                        break
            else:
                pytest.fail("no stream started on m0")
            page = await scrape(s, r.url)
            health = r.router.health.snapshot()
    recs = records(raw, shape)
    assert text(recs, shape) == [WORDS[i % 16] for i in range(TOKENS)]  # the whole text, seamless
    assert not any("error" in x for x in recs) and CRASH.encode() not in raw  # the record was never sent
    if shape == "ollama":
        assert sum(1 for x in recs if x.get("done")) == 1 and recs[-1]["eval_count"] == TOKENS
    else:
        assert raw.count(b"[DONE]") == 1
    rec = done[-1]
    assert (rec.status, rec.error, rec.resumed, rec.endpoint) == (200, None, 1, "m1")  # the client got it all
    assert bad.stats()["errors_injected"]["error"] == 1
    assert metric(page, "nomyo_router_events_total", what="error_record", endpoint="m0") == 1
    assert metric(page, "nomyo_router_events_total", what="resumed", endpoint="m1") == 1
    assert metric(page, "nomyo_router_requests_total", status="502") == 0
    assert health["m0"]["consecutive_failures"] == 1 and health["m1"]["consecutive_failures"] == 0
    if native_relay and native.AVAILABLE and shape == "ollama":  # (the OpenAI stream's usage is stripped: Python)
        assert pumped["error"] == 1  # the pump found the record and handed it back


@pytest.mark.parametrize("native_relay", [True, False])
@pytest.mark.parametrize("resume", [True, False])  # record-wise relay, nowhere to resume / pass-through
@pytest.mark.parametrize("path,shape", PATHS)
async def test_an_error_record_that_cannot_be_resumed_is_relayed_and_counted_as_a_502(
    pumped, native_relay, resume, path, shape
):
    async with run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=TOKENS, error_rate=1.0) as bad:
        cfg = {"endpoints": endpoints(bad), "native_relay": native_relay, "resume_streams": resume, "access_log": True}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            done: list[RequestRecord] = []
            r.router.events.on_request_done(done.append)
            async with s.post(r.url + path, json=body(path)) as resp:
                assert resp.status == 200  # (the head went out before the runner crashed)
                raw = await resp.read()
            page = await scrape(s, r.url)
            health = r.router.health.snapshot()
            async with s.post(r.url + path, json={**body(path, 1), "stream": False}) as again:
                assert again.status == 502  # (a whole answer: see below) and the router still serves
    recs = records(raw, shape)
    assert text(recs, shape) == [WORDS[i % 16] for i in range(TOKENS // 2)]  # what came before the crash
    err = recs[-1]["error"]
    assert (err if shape == "ollama" else err["message"]) == CRASH  # the backend's own record, last
    assert not any(x.get("done") for x in recs) and b"[DONE]" not in raw  # nothing after it
    rec = done[0]
    assert (rec.status, rec.error, rec.endpoint) == (502, "backend_error_record", "m0")
    assert metric(page, "nomyo_router_requests_total", status="502", endpoint="m0") == 1
    assert metric(page, "nomyo_router_requests_total", status="200") == 0
    assert metric(page, "nomyo_router_events_total", what="error_record", endpoint="m0") == 1
    assert health["m0"]["consecutive_failures"] == 1
    plain = shape == "ollama" or not resume  # (an OpenAI stream resumable has its usage stripped: Python)
    assert pumped["error"] == (native_relay and native.AVAILABLE and plain)


async def test_an_error_record_in_a_translated_stream_is_relayed_and_counted_as_a_502():
    async with run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=TOKENS, error_rate=1.0) as bad:
        eps = [{"url": bad.url, "name": "oa", "type": "openai", "max_concurrent": 2}]
        async with run_router({"endpoints": eps}) as r, aiohttp.ClientSession() as s:
            done: list[RequestRecord] = []
            r.router.events.on_request_done(done.append)
            async with s.post(r.url + "/api/chat", json=body("/api/chat")) as resp:
                assert resp.status == 200
                raw = await resp.read()
            page = await scrape(s, r.url)
    recs = records(raw, "ollama")
    assert text(recs, "ollama") == [WORDS[i % 16] for i in range(TOKENS // 2)]
    assert recs[-1] == {"error": CRASH} and not any(x.get("done") for x in recs)
    assert (done[0].status, done[0].error) == (502, "backend_error_record")
    assert metric(page, "nomyo_router_events_total", what="error_record", endpoint="oa") == 1


@pytest.mark.parametrize("path,shape", PATHS)
async def test_a_whole_answer_that_is_an_error_object_is_retried_then_a_502(path, shape):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8, error_rate=1.0) as bad,
        run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as good,
    ):
        # (asked whole: a whole answer's stream with an error record is resumed, not retried)
        whole = {"stream_whole_answers": False}
        cfg = {"endpoints": endpoints(bad, good), "routing": "least_busy", "eject_after": 1000, **whole}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            done: list[RequestRecord] = []
            r.router.events.on_request_done(done.append)
            for n in range(30):  # until one went to m0 first: retried on m1
                async with s.post(r.url + path, json=body(path, n, stream=False)) as resp:
                    assert resp.status == 200
                    answer = await resp.json()
                if done[-1].retries:
                    break
            else:
                pytest.fail("no request went to m0")
            assert "error" not in answer and resp.headers["X-Router-Endpoint"] == "m1"
            assert (done[-1].status, done[-1].error) == (200, None)
            assert r.router.health.snapshot()["m0"]["consecutive_failures"] >= 1
        async with run_router({"endpoints": endpoints(bad), **whole}) as r, aiohttp.ClientSession() as s:
            done = []
            r.router.events.on_request_done(done.append)
            async with s.post(r.url + path, json=body(path, stream=False)) as resp:
                assert resp.status == 502  # no other endpoint: the backend's error, as a failure
                err = (await resp.json())["error"]
            page = await scrape(s, r.url)
    assert (err if shape == "ollama" else err["message"]) == CRASH
    assert (done[0].status, done[0].error) == (502, "backend_error_record")
    assert metric(page, "nomyo_router_requests_total", status="502", endpoint="m0") == 1
    assert metric(page, "nomyo_router_events_total", what="error_record", endpoint="m0") == 1


async def test_content_that_merely_says_error_is_not_an_error_record():
    # Only a record that parses to an error object is one: a token "error", a tool argument
    # named "error", or a quoted "error" inside text pass as they are.
    from nomyo_router.relay.error_record import find, whole

    lines = [
        b'{"message":{"role":"assistant","content":"error"},"done":false}\n',
        b'{"message":{"tool_calls":[{"function":{"arguments":{"error":"x"}}}]},"done":false}\n',
        b'{"message":{"content":"say \\"error\\" twice"},"done":false}\n',
    ]
    assert find(b"".join(lines), b"\n") == (-1, -1)
    crash = b'{"error":"boom"}\n'
    assert find(b"".join(lines) + crash + b'{"done":true}\n', b"\n")[0] == len(b"".join(lines))
    sse = b'data: {"choices":[{"delta":{"content":"error"}}]}\n\ndata: {"error": {"message": "x"}}\n\n'
    assert find(sse, b"\n\n") == (sse.index(b'data: {"error'), len(sse))
    assert find(b'{"error":"not whole yet', b"\n") == (-1, -1)
    assert whole(b'{"error": "boom"}') and whole(b'{"object": "error", "message": "x"}')
    assert not whole(b'{"model": "m", "message": {"content": "{\\"error\\": 1}"}, "done": true}')
    await asyncio.sleep(0)
