"""Per-key rate limits and token budgets (rpm, tpm, tokens_per_day): the count itself, the
429s in each API's shape with Retry-After and x-ratelimit-* headers, and exactness across
workers (--workers 2) and across instances (Redis)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.state.key_limits import DAY_S, Limiter, Limits
from test.conftest import FAST
from test.helpers import endpoints, run_router
from test.router_proc import router_workers

KEY = "limited-key-0123456789"
FREE = "unlimited-key-0123456789"
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}


def keys(**limits: Any) -> list[dict[str, Any]]:
    return [{"name": "alice", "key": KEY, **limits}, {"name": "bob", "key": FREE}]


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---- the count ----------------------------------------------------------------------------
def test_rpm_is_a_rolling_window():
    lim, limits = Limiter(), Limits(rpm=3)
    assert [lim.admit("a", limits, t).refused for t in (0.0, 10.0, 20.0, 30.0)] == [None, None, None, "rpm"]
    v = lim.admit("a", limits, 59.0)
    assert v.refused == "rpm" and abs(v.retry_after - 1.0) < 1e-9 and v.requests == 3
    assert lim.admit("a", limits, 60.5).refused is None  # the one at 0 left the window
    assert lim.admit("a", limits, 61.0).refused == "rpm"  # 10, 20, 60.5 are in it
    assert lim.admit("b", limits, 61.0).refused is None  # every key has its own count


def test_tpm_admits_while_the_last_minute_is_below_the_limit():
    lim, limits = Limiter(), Limits(tpm=100)
    assert lim.admit("a", limits, 0.0).refused is None
    lim.spend("a", 60, limits, 1.0)
    assert lim.admit("a", limits, 2.0).refused is None  # 60 < 100: admitted (its cost is not known yet)
    lim.spend("a", 60, limits, 3.0)
    v = lim.admit("a", limits, 4.0)
    assert v.refused == "tpm" and v.tokens == 120
    assert abs(v.retry_after - 57.0) < 1e-9  # when the spend at 1 leaves, 60 < 100
    assert lim.admit("a", limits, 61.5).refused is None


def test_the_daily_budget_is_the_utc_day():
    lim, limits = Limiter(), Limits(tokens_per_day=1000)
    day = 20000 * DAY_S
    lim.spend("a", 1000, limits, day + 3600)
    v = lim.admit("a", limits, day + 7200)
    assert v.refused == "tokens_per_day" and abs(v.retry_after - (DAY_S - 7200)) < 1e-6
    assert lim.admit("a", limits, day + DAY_S + 1).refused is None  # a new day


def test_a_refused_request_is_not_counted():
    lim, limits = Limiter(), Limits(rpm=1, tokens_per_day=10)
    assert lim.admit("a", limits, 0.0).refused is None
    for t in range(1, 30):
        assert lim.admit("a", limits, float(t)).refused == "rpm"
    assert lim.admit("a", limits, 60.0).refused is None


# ---- on the wire -------------------------------------------------------------------------
async def test_rpm_429_in_each_api_shape_with_headers_and_no_backend_call():
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": keys(rpm=3, tpm=100000)}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            remaining = []
            for _ in range(3):
                async with s.post(r.url + "/api/chat", json=CHAT, headers=auth()) as resp:
                    assert resp.status == 200
                    await resp.read()
                    assert resp.headers["x-ratelimit-limit-requests"] == "3"
                    assert resp.headers["x-ratelimit-limit-tokens"] == "100000"
                    remaining.append(resp.headers["x-ratelimit-remaining-requests"])
            assert remaining == ["2", "1", "0"]  # counting the request itself
            async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                assert resp.status == 429
                body = await resp.json()
                assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"
                assert 1 <= int(resp.headers["Retry-After"]) <= 60
                assert resp.headers["x-ratelimit-remaining-requests"] == "0"
            async with s.post(r.url + "/api/chat", json=CHAT, headers=auth()) as resp:
                assert resp.status == 429
                assert list(await resp.json()) == ["error"]  # Ollama's shape
                assert "Retry-After" in resp.headers
            async with s.post(r.url + "/v1/messages", json={**CHAT, "max_tokens": 5}, headers=auth()) as resp:
                assert resp.status == 429
                assert (await resp.json())["error"]["type"] == "rate_limit_error"
            async with s.post(r.url + "/api/chat", json=CHAT, headers=auth(FREE)) as resp:
                assert resp.status == 200  # another key is not limited by it
                assert "x-ratelimit-limit-requests" not in resp.headers
        assert m.stats()["requests_total"] == 4  # three of alice's, one of bob's: no 429 reached it


async def test_an_admitted_request_answered_with_an_error_carries_the_headers():
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": keys(rpm=5)}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=auth()) as resp:
                assert resp.status == 404
                assert resp.headers["x-ratelimit-remaining-requests"] == "4"
            async with s.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth()) as resp:
                assert resp.status == 200
                await resp.read()
                assert resp.headers["x-ratelimit-remaining-requests"] == "3"


async def test_tpm_and_the_daily_budget_count_the_backends_tokens():
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": keys(tpm=30, tokens_per_day=10**6)}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            statuses, used = [], 0
            for _ in range(6):
                async with s.post(r.url + "/api/chat", json=CHAT, headers=auth()) as resp:
                    statuses.append(resp.status)
                    body = await resp.json()
                    if resp.status == 200:
                        used += body["prompt_eval_count"] + body["eval_count"]
                    else:
                        assert body["error"].startswith("rate limit reached for this API key: 30 tokens per minute")
                        assert int(resp.headers["Retry-After"]) >= 1
                        assert resp.headers["x-ratelimit-remaining-tokens"] == "0"
            per = used // statuses.count(200)
            admitted = -(-30 // per)  # admitted while the minute's use is below 30
            assert statuses == [200] * admitted + [429] * (6 - admitted)
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": keys(tokens_per_day=10), "admin_key": "admin-key-0123456789"}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                assert resp.status == 200
                assert resp.headers["x-ratelimit-limit-tokens"] == "10"
            async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                assert resp.status == 429
                err = (await resp.json())["error"]
                assert err["code"] == "insufficient_quota" and err["type"] == "insufficient_quota"
                midnight = (int(time.time() // DAY_S) + 1) * DAY_S
                assert abs(int(resp.headers["Retry-After"]) - (midnight - time.time())) < 5
            await r.router.rate_limits.refresh()
            assert r.router.rate_limits.describe()["alice"]["tokens_per_day"]["used"] >= 10
            text = r.router.metrics.render().decode()
            assert 'nomyo_router_client_limit{client="alice",limit="tokens_per_day"} 10.0' in text
            assert 'nomyo_router_client_used{client="alice",limit="tokens_per_day"}' in text
            async with s.get(r.url + "/dashboard/data", headers=auth("admin-key-0123456789")) as resp:
                limits = (await resp.json())["limits"]
            assert limits["alice"]["tokens_per_day"]["limit"] == 10
            assert limits["alice"]["tokens_per_day"]["used"] >= 10 and "bob" not in limits


async def _spread(url: str, n: int, gap: float = 0.0, key: str = KEY) -> list[tuple[int, str | None]]:
    """n requests `gap` apart, each on its own connection (so they spread over workers)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

        async def one(i: int) -> tuple[int, str | None]:
            await asyncio.sleep(i * gap)
            async with s.post(url + "/api/chat", json=CHAT, headers=auth(key)) as resp:
                await resp.read()
                return resp.status, resp.headers.get("X-Router-Worker")

        return await asyncio.gather(*[one(i) for i in range(n)])


async def test_limits_are_exact_across_workers():
    rounds = [f"limited-key-{i}-0123456789" for i in range(4)]  # a fresh key (and count) per round
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=8, parallel=64)) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "one", "max_concurrent": 64}],
            "client_keys": [{"name": f"k{i}", "key": key, "rpm": 10} for i, key in enumerate(rounds)],
        }
        with router_workers(cfg, 2) as (url, _):
            spread = False
            for i, key in enumerate(rounds):  # until a round's admitted requests came through both workers
                results = await _spread(url, 30, gap=0.02, key=key)
                statuses = [st for st, _ in results]
                assert statuses.count(200) == 10 and statuses.count(429) == 20, statuses
                async with aiohttp.ClientSession() as s:
                    stats = await (await s.get(m.url + "/mock/stats")).json()
                assert stats["requests_total"] == 10 * (i + 1)  # no refused request reached it
                if len({w for st, w in results if st == 200}) == 2:
                    spread = True
                    break
    assert spread, "every round's admitted requests went through one worker"
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=8, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "one", "max_concurrent": 64}], "client_keys": keys(tpm=30)}
        with router_workers(cfg, 2) as (url, _):
            statuses, per = [], 0
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                for _ in range(8):  # one after another, each answer's tokens spent before the next asks
                    async with s.post(url + "/api/chat", json=CHAT, headers=auth()) as resp:
                        statuses.append(resp.status)
                        body = await resp.json()
                        per = per or body["prompt_eval_count"] + body["eval_count"]
                    await asyncio.sleep(0.05)
    assert statuses == [200] * -(-30 // per) + [429] * (8 - -(-30 // per))


async def test_limits_are_exact_across_instances_with_redis(redis_url):
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m, slots=64), "state": redis_url, "client_keys": keys(rpm=7)}
        async with run_router(cfg) as r1, run_router(cfg) as r2:
            results = await asyncio.gather(_spread(r1.url, 10), _spread(r2.url, 10))
            statuses = [st for part in results for st, _ in part]
            assert statuses.count(200) == 7 and statuses.count(429) == 13
            assert m.stats()["requests_total"] == 7
            v = await r2.router.store.admit("alice", r2.router.rate_limits.by_client["alice"], count=False)
            assert v.requests == 7 and v.refused == "rpm"
    async with run_mock(**FAST) as m:
        cfg = {"endpoints": endpoints(m, slots=64), "state": redis_url, "client_keys": keys(tokens_per_day=20)}
        async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:
            got, per = [], 0
            for r in (r1, r2, r1, r2, r1):
                async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                    got.append(resp.status)
                    per = per or (await resp.json())["usage"]["total_tokens"]
                await asyncio.sleep(0.1)  # (the spend is sent as the answer ends, without waiting)
            admitted = -(-20 // per)  # admitted while today's use is below 20, counted once for both
            assert got == [200] * admitted + [429] * (5 - admitted) and admitted < 5
