"""Liveness that fits generation: a long whole answer is never cut as hung, a backend silent
mid-generation is wedged (resumed elsewhere, or ended with a clear error within the gap).
Real sockets: the mock and the router on 127.0.0.1, the official clients."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import aiohttp
import ollama
import openai

from mock import run_mock
from test.helpers import endpoints, run_router

assert ollama.AsyncClient and openai.AsyncOpenAI  # (imported here: not on the router's loop, mid-test)

# short answers teach the router a whole answer takes ~10 ms; then one takes 50x longer
SLOW = dict(ttft_ms=0.0, tok_ms=2.0, tokens=120)
QUICK = {"first_byte_floor": 0.1, "first_byte_factor": 2.0, "stream_idle_timeout": 1.0, "eject_after": 1}
MSGS = [{"role": "user", "content": "hi"}]


async def test_a_long_whole_answer_after_short_ones_is_answered_once(clients):
    async with run_mock(**SLOW) as m:
        async with run_router({"endpoints": endpoints(m, slots=4), **QUICK}) as r:
            done: list = []
            r.router.events.on_request_done(done.append)
            ejections: list = []
            r.router.events.on_count(lambda what, ep, model: ejections.append(what) if what == "ejection" else None)
            oll, oai = clients.ollama(r.url), clients.openai(r.url)
            for _ in range(4):  # short whole answers, bounded: whole upstream calls with a deadline that knows it
                short = await oll.chat(model="llama3", messages=MSGS, options={"num_predict": 2})
                assert short.eval_count == 2
                small = await oai.chat.completions.create(model="llama3", messages=MSGS, max_tokens=2)
                assert small.usage.completion_tokens == 2
            calls = sum(m.stats()["requests"].values())
            # 120 tokens at 2 ms: ~0.25 s, beyond what short answers taught (and 50x their time)
            t0 = time.perf_counter()
            long = await oll.chat(model="llama3", messages=MSGS)
            ochat = await oai.chat.completions.create(model="llama3", messages=MSGS)
            gen = await oll.generate(model="llama3", prompt="hi")
            text = await oai.completions.create(model="llama3", prompt="hi")
            assert time.perf_counter() - t0 > 4 * 0.2
            assert long.done and long.eval_count == 120 and len(long.message.content) > 120
            assert long.message.role == "assistant" and long.done_reason == "stop"
            assert ochat.object == "chat.completion" and ochat.usage.completion_tokens == 120
            assert ochat.choices[0].message.content == long.message.content
            assert ochat.choices[0].finish_reason == "stop"
            assert gen.response and gen.eval_count == 120
            assert text.object == "text_completion" and text.usage.completion_tokens == 120
            assert text.choices[0].text == gen.response
            assert sum(m.stats()["requests"].values()) == calls + 4  # one backend call each: no retry
            assert [d.retries for d in done[-4:]] == [0, 0, 0, 0]
            assert [d.tokens_from for d in done[-4:]] == ["backend"] * 4
            assert ejections == []


async def test_the_assembled_answer_is_the_backends_own_whole_answer():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=12) as m, aiohttp.ClientSession() as s:
        async with run_router({"endpoints": endpoints(m), **QUICK}) as r:
            for path, body in (
                ("/api/chat", {"model": "llama3", "messages": MSGS, "stream": False}),
                ("/api/generate", {"model": "llama3", "prompt": "hi", "stream": False}),
                ("/v1/chat/completions", {"model": "llama3", "messages": MSGS}),
                ("/v1/completions", {"model": "llama3", "prompt": "hi"}),
            ):
                async with s.post(m.url + path, json=body) as direct:
                    own = await direct.json()
                async with s.post(r.url + path, json=body) as via:  # (nothing learned: streamed)
                    assert via.headers["content-type"] == "application/json"
                    got = await via.json()
                assert sorted(got) == sorted(own), path
                for key in ("message", "response", "eval_count", "prompt_eval_count", "done_reason", "usage"):
                    assert got.get(key) == own.get(key), (path, key)
                if "choices" in own:
                    assert got["choices"] == own["choices"] and got["object"] == own["object"], path


async def _wedged_stream(url: str, s: aiohttp.ClientSession, path: str, body: dict) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    async with s.post(url + path, json=body) as resp:
        return resp.status, await resp.read(), time.perf_counter() - t0


async def test_a_backend_wedged_mid_stream_alone_ends_within_the_gap_with_a_clear_error():
    async with run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=40, wedge_rate=1.0) as m, aiohttp.ClientSession() as s:
        async with run_router({"endpoints": endpoints(m), **QUICK}) as r:
            done: list = []
            r.router.events.on_request_done(done.append)
            stream = {"model": "llama3", "messages": MSGS, "stream": True}
            status, body, took = await _wedged_stream(r.url, s, "/api/chat", stream)
            assert status == 200 and took < 5
            last = body.rstrip().rsplit(b"\n", 1)[-1]
            assert b"stream_idle_timeout" in last and b'"error"' in last
            assert b'"content"' in body  # the first half went out as it came
            assert done[-1].error == "stream_stalled"
            assert done[-1].completion_tokens == 20 and done[-1].tokens_from == "relayed"
            # a whole answer on the only endpoint: a 502 in its API's shape, within the gap
            status, body, took = await _wedged_stream(
                r.url, s, "/v1/chat/completions", {"model": "llama3", "messages": MSGS}
            )
            assert status == 502 and took < 5
            assert b"stream_idle_timeout" in body and b'"message"' in body
            assert (done[-1].status, done[-1].error, done[-1].completion_tokens) == (502, "stream_stalled", None)
            # it keeps wedging (eject_after: 1): /health no longer calls it healthy (the last one: in rotation)
            async with s.get(r.url + "/health") as h:
                health = await h.json()
            assert h.status == 200 and health["status"] == "degraded"
            row = health["endpoints"][0]
            assert row["health"]["state"] == "failing" and row["healthy"] is False


async def test_a_backend_wedged_mid_answer_is_resumed_on_another():
    async with run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=40, wedge_rate=1.0) as bad:
        async with run_mock(ttft_ms=0.0, tok_ms=1.0, tokens=40) as good, aiohttp.ClientSession() as s:
            async with s.post(good.url + "/api/chat", json={"model": "llama3", "messages": MSGS, "stream": False}) as d:
                whole = (await d.json())["message"]["content"]
            cfg = {**QUICK, "eject_after": 100, "conversation_affinity": False}  # (the wedged one stays in play)
            async with run_router({"endpoints": endpoints(bad, good), **cfg}) as r:
                done: list = []
                r.router.events.on_request_done(done.append)
                for stream in (True, False):
                    body = {"model": "llama3", "messages": MSGS, "stream": stream}
                    for _ in range(10):  # until the wedged one was tried (the policy may pick either)
                        status, raw, took = await _wedged_stream(r.url, s, "/api/chat", body)
                        assert status == 200 and took < 5
                        if done[-1].resumed:
                            break
                    assert done[-1].resumed == 1 and done[-1].error is None and done[-1].retries == 0
                    lines = [json.loads(line) for line in raw.splitlines()]
                    assert "".join(x["message"]["content"] for x in lines) == whole
                    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 40


async def test_a_client_cut_stream_is_counted_as_relayed(caplog):
    """The client reads 5 chunks of a 200-token stream and leaves: the record (and the access
    line, what the router exposes) carries what was relayed, on the record-wise relay (resume
    on) and the pass-through one with the compiled pump (resume off)."""
    async with run_mock(ttft_ms=0.0, tok_ms=20.0, tokens=200) as m, aiohttp.ClientSession() as s:
        for resume in (True, False):
            cfg = {"endpoints": endpoints(m), "resume_streams": resume, "access_log": True, "log_format": "json"}
            async with run_router(cfg) as r:
                done: list = []
                r.router.events.on_request_done(done.append)
                for path in ("/api/chat", "/v1/chat/completions"):
                    body = {"model": "llama3", "messages": MSGS, "stream": True}
                    seen = 0
                    with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
                        async with s.post(r.url + path, json=body) as resp:
                            async for line in resp.content:
                                seen += b'"content"' in line
                                if seen == 5:
                                    break
                        for _ in range(100):
                            if done and done[-1].route == path:
                                break
                            await asyncio.sleep(0.02)
                    rec = done[-1]
                    assert rec.tokens_from == "relayed", (resume, path)
                    assert 5 <= rec.completion_tokens < 60, (resume, path, rec.completion_tokens)
                    assert rec.prompt_tokens and rec.prompt_tokens > 0
                    line = [x.access for x in caplog.records if x.name == "nomyo_router.access"][-1]
                    assert (line["tokens_in"], line["tokens_out"]) == (rec.prompt_tokens, rec.completion_tokens)
