"""Timing, capacity, KV cache, faults and stats of the mock."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from mock import run_mock
from mock.server import OLLAMA_BUSY

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hello"}]}


async def post(session, url, body, path="/api/chat"):
    async with session.post(url + path, json=body) as r:
        return r.status, await r.read()


async def first_content_time(session, url, body) -> tuple[float, float]:
    """(seconds to the first non-empty content, seconds to the end) of an Ollama stream."""
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url + "/api/chat", json=body) as r:
        async for line in r.content:
            if ttft is None and json.loads(line)["message"]["content"]:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


@pytest.mark.alone
async def test_ttft_and_total_time_follow_the_model():
    async with run_mock(ttft_ms=100.0, tok_ms=10.0, tokens=10) as m, aiohttp.ClientSession() as s:
        ttft, total = await first_content_time(s, m.url, CHAT)
        assert abs(ttft - 0.100) <= 0.100 * 0.10 + 0.005
        assert abs(total - (0.100 + 10 * 0.010)) <= 0.200 * 0.10 + 0.005


async def test_parallel_two_runs_six_requests_in_three_waves():
    async with run_mock(ttft_ms=0.0, tok_ms=20.0, tokens=5, parallel=2) as m, aiohttp.ClientSession() as s:

        async def timed():
            await post(s, m.url, {**CHAT, "stream": False})
            return time.perf_counter() - t0

        t0 = time.perf_counter()
        ends = sorted(await asyncio.gather(*[timed() for _ in range(6)]))
        # two at a time: a request of 5 tokens x 20 ms takes >= 100 ms, and the 3rd and 5th
        # can only start when one of the two before them ended (a busy machine only stretches
        # these gaps, so no upper bound)
        assert ends[0] >= 0.095, ends
        assert ends[2] - ends[0] >= 0.095 and ends[4] - ends[2] >= 0.095, ends
        assert m.stats()["max_active"] == 2
        assert m.stats()["max_in_flight"] == 6


async def test_queue_limit_answers_the_real_503():
    async with (
        run_mock(ttft_ms=200.0, tok_ms=0.0, tokens=1, parallel=1, max_queue=1) as m,
        aiohttp.ClientSession() as s,
    ):
        results = await asyncio.gather(*[post(s, m.url, {**CHAT, "stream": False}) for _ in range(3)])
        busy = [b for st, b in results if st == 503]
        assert [st for st, _ in results].count(200) == 2 and len(busy) == 1
        assert json.loads(busy[0]) == {"error": OLLAMA_BUSY}
        openai_chat = {"model": "llama3", "messages": [], "stream": False}
        results = await asyncio.gather(*[post(s, m.url, openai_chat, "/v1/chat/completions") for _ in range(3)])
        busy = [b for st, b in results if st == 503]
        assert len(busy) == 1 and json.loads(busy[0])["error"]["type"] == "server_error"


async def test_warm_follow_up_beats_cold_instance_by_prefill_cost():
    knobs = dict(ttft_ms=10.0, tok_ms=0.0, tokens=4, prefill_ms_per_1k_tokens=100.0)
    history = [{"role": "system", "content": "s" * 2000}, {"role": "user", "content": "u" * 6000}]  # ~2000 tokens
    async with run_mock(**knobs) as a, run_mock(**knobs) as b, aiohttp.ClientSession() as s:
        st, raw = await post(s, a.url, {"model": "llama3", "messages": history, "stream": False})
        answer = json.loads(raw)["message"]
        turn2 = {
            "model": "llama3",
            "stream": True,
            "messages": history + [answer, {"role": "user", "content": "and then?"}],
        }
        warm, _ = await first_content_time(s, a.url, turn2)
        cold, _ = await first_content_time(s, b.url, turn2)
        # cold pays ~2000 tokens x 0.1 ms = ~200 ms; warm only the last partial block
        assert cold - warm >= 0.150, (cold, warm)
        assert warm < 0.030
        kv_a = a.stats()["kv_cache"]
        assert kv_a["hits"] == 1 and kv_a["hit_tokens"] >= 1900
        assert b.stats()["kv_cache"]["hits"] == 0


async def test_kv_cache_is_lru_bounded():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=1, kv_cache_tokens=1024) as m, aiohttp.ClientSession() as s:
        for i in range(3):
            await post(s, m.url, {"model": "llama3", "prompt": str(i) * 2048, "stream": False}, "/api/generate")
        assert m.stats()["kv_cache"]["cached_tokens"] <= 1024
        await post(s, m.url, {"model": "llama3", "prompt": "0" * 2048, "stream": False}, "/api/generate")
        assert m.stats()["kv_cache"]["hits"] == 0  # the first prompt was evicted


@pytest.mark.parametrize("knob,expect", [("fail_rate", 500), ("busy_rate", 503)])
async def test_status_faults_switch_live(knob, expect):
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=2) as m, aiohttp.ClientSession() as s:
        assert (await post(s, m.url, {**CHAT, "stream": False}))[0] == 200
        async with s.post(m.url + "/mock/config", json={knob: 1.0}) as r:
            assert r.status == 200 and (await r.json())[knob] == 1.0
        assert (await post(s, m.url, {**CHAT, "stream": False}))[0] == expect
        await s.post(m.url + "/mock/config", json={knob: 0.0})
        assert (await post(s, m.url, {**CHAT, "stream": False}))[0] == 200
        assert m.stats()["errors_injected"] == {knob.split("_")[0]: 1}


async def test_drop_cuts_the_stream_midway():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=10, drop_rate=1.0) as m, aiohttp.ClientSession() as s:
        lines = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(m.url + "/api/chat", json=CHAT) as r:
                async for line in r.content:
                    lines.append(line)
        assert len(lines) == 5 and not any(json.loads(line)["done"] for line in lines)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(s, m.url, {**CHAT, "stream": False})
        assert m.stats()["in_flight"] == 0 and m.stats()["active"] == 0


async def test_hang_never_answers_and_first_byte_delay_delays_headers():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=1, hang_rate=1.0) as m, aiohttp.ClientSession() as s:
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(m.url + "/api/chat", json=CHAT, timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                await r.read()
        m.update(hang_rate=0.0, first_byte_delay_ms=150.0)
        t0 = time.perf_counter()
        async with s.post(m.url + "/api/chat", json=CHAT) as r:
            headers_at = time.perf_counter() - t0
            await r.read()
        assert 0.145 <= headers_at < 0.4


async def test_faults_are_deterministic_under_a_seed():
    async def pattern():
        async with (
            run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=1, fail_rate=0.5, seed=7) as m,
            aiohttp.ClientSession() as s,
        ):
            return [(await post(s, m.url, {**CHAT, "stream": False}))[0] for _ in range(20)]

    first, second = await pattern(), await pattern()
    assert first == second and 500 in first and 200 in first


async def test_stats_count_routes_and_config_rejects_bad_knobs(mock):
    long_chat = {
        "model": "llama3",
        "stream": False,
        "messages": [{"role": "user", "content": "hello " * 100}],
    }  # > one KV block
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            await post(s, mock.url, long_chat)
        await post(s, mock.url, {"model": "llama3", "input": "x"}, "/v1/embeddings")
        async with s.get(mock.url + "/mock/stats") as r:
            stats = await r.json()
        assert stats["requests"] == {"/api/chat": 3, "/v1/embeddings": 1}
        assert stats["completed"] == {"/api/chat": 3, "/v1/embeddings": 1}
        assert stats["in_flight"] == 0 and stats["max_in_flight"] == 1
        assert stats["kv_cache"]["misses"] == 2 and stats["kv_cache"]["hits"] == 2
        async with s.post(mock.url + "/mock/config", json={"nope": 1}) as r:
            assert r.status == 400 and "unknown knob" in (await r.json())["error"]
        async with s.post(mock.url + "/mock/config", json={"parallel": "x"}) as r:
            assert r.status == 400


@pytest.mark.alone
async def test_batch_slowdown_bends_throughput():
    async with (
        run_mock(ttft_ms=0.0, tok_ms=10.0, tokens=10, parallel=4, batch_slowdown=1.0) as m,
        aiohttp.ClientSession() as s,
    ):
        t0 = time.perf_counter()
        await post(s, m.url, {**CHAT, "stream": False})
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        await asyncio.gather(*[post(s, m.url, {**CHAT, "stream": False}) for _ in range(4)])
        together = time.perf_counter() - t0
    assert 0.09 <= alone <= 0.15  # 10 tokens x 10 ms
    assert together >= 2.5 * alone  # 4 active sequences: each token up to 4x slower


async def test_jitter_is_seeded():
    """The TTFT drawn for each request (Ollama's prompt_eval_duration says which) is waited for,
    varies, and the same seed draws the same ones again. (The drawn values are compared, not
    the times seen: a busy machine adds its own delays to those.)"""

    async def ttfts(seed: int) -> tuple[list[float], list[float]]:
        async with (
            run_mock(ttft_ms=40.0, tok_ms=0.0, tokens=1, jitter=0.5, jitter_dist="uniform", seed=seed) as m,
            aiohttp.ClientSession() as s,
        ):
            seen, drawn = [], []
            for _ in range(6):
                t0 = time.perf_counter()
                status, body = await post(s, m.url, {**CHAT, "stream": False})
                seen.append(time.perf_counter() - t0)
                assert status == 200
                drawn.append(json.loads(body)["prompt_eval_duration"] / 1e9)
            return seen, drawn

    (seen, a), (_, b) = await ttfts(3), await ttfts(3)
    assert all(0.020 <= x <= 0.060 for x in a)  # 40 ms +- 50%
    assert all(t > x - 0.002 for t, x in zip(seen, a, strict=True))  # waited for (a timer may fire 1 ms early)
    assert max(a) - min(a) > 0.010 and max(seen) - min(seen) > 0.010  # it varies
    assert a == b  # and the same seed replays it


async def _stream_lines(session, url, body, path="/api/chat") -> list[bytes]:
    async with session.post(url + path, json=body) as r:
        assert r.status == 200
        return [line async for line in r.content if line.strip()]


def _without_clock(lines: list[bytes]) -> list[dict]:
    out = []
    for line in lines:
        text = line.decode().strip()
        if text == "data: [DONE]":
            out.append({"done": "[DONE]"})
            continue
        d = json.loads(text.removeprefix("data: "))
        for key in ("created_at", "created", "id", "total_duration", "prompt_eval_duration", "eval_duration"):
            d.pop(key, None)
        out.append(d)
    return out


def _content(d: dict) -> str:
    c = (d.get("choices") or [{}])[0]
    return (
        (d.get("message") or {}).get("content")
        or d.get("response")
        or (c.get("delta") or {}).get("content")
        or c.get("text")
        or ""
    )


@pytest.mark.parametrize(
    "path,body",
    [
        ("/api/chat", CHAT),
        ("/api/generate", {"model": "llama3", "prompt": "hi", "options": {"num_predict": 5}}),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"model": "llama3", "prompt": "hi", "max_tokens": 0}),
    ],
)
async def test_stream_tick_writes_the_same_chunks(path, body):
    """`stream_tick_ms` (one shared timer for every stream) changes when chunks are written,
    never what is written; no chunk comes before its deadline."""
    body = {**body, "stream": True}
    async with (
        run_mock(ttft_ms=30.0, tok_ms=4.0, tokens=12) as plain,
        run_mock(ttft_ms=30.0, tok_ms=4.0, tokens=12, stream_tick_ms=5.0) as ticked,
        aiohttp.ClientSession() as s,
    ):
        want = _without_clock(await _stream_lines(s, plain.url, body, path))
        t0 = time.perf_counter()
        got = await asyncio.gather(*(_stream_lines(s, ticked.url, body, path) for _ in range(20)))
        elapsed = time.perf_counter() - t0
        assert all(_without_clock(lines) == want for lines in got)
        tokens = sum(1 for d in want if _content(d))
        assert tokens == {"/api/generate": 5, "/v1/completions": 0}.get(path, 12)
        assert elapsed >= 0.030 + 0.004 * max(tokens - 1, 0)  # the deadlines hold: nothing early
        assert ticked.stats()["completed"] == {path: 20} and ticked.stats()["active"] == 0


async def test_stream_tick_client_leaving_frees_the_slot():
    async with run_mock(ttft_ms=0.0, tok_ms=20.0, tokens=100, stream_tick_ms=5.0) as m, aiohttp.ClientSession() as s:
        async with s.post(m.url + "/api/chat", json=CHAT) as r:
            first = await r.content.readline()
            assert json.loads(first)["message"]["content"]
        for _ in range(100):
            if m.stats()["active"] == 0:
                break
            await asyncio.sleep(0.01)
        assert m.stats()["active"] == 0 and m.stats()["in_flight"] == 0
        lines = await _stream_lines(s, m.url, {**CHAT, "options": {"num_predict": 3}})
        assert len(lines) == 4 and json.loads(lines[-1])["done"] is True
