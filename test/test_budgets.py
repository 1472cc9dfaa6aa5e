"""Token budgets (tpm, tokens_per_day) that hold: a request reserves what it may spend when it
is admitted and settles to what it used when it ends, so requests arriving together pass a
budget by at most one reservation (one process, `--workers 2`); a restart remembers what was
spent (the usage database, Redis); usage rows and the usage stream say whose counts their
tokens are; a stream the client cuts is charged."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.api.key_admission import OUTPUT_ESTIMATE, reservation
from nomyo_router.api.requests import parse
from nomyo_router.events import Events, RequestRecord
from nomyo_router.ops.usage.budgets import read_spent
from nomyo_router.ops.usage.store import SqliteUsage
from nomyo_router.state.key_limits import HOLD_S, Limiter, Limits
from test.helpers import endpoints, run_router
from test.router_proc import router_workers

KEY = "budget-key-0123456789"
ADMIN = "admin-key-0123456789"
MAX_TOKENS = 10
# what each request below reserves: its prompt ("user" and "x", 5 characters: 2 tokens at 4
# characters a token) and its max_tokens
RESERVED = 2 + MAX_TOKENS
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "x"}], "max_tokens": MAX_TOKENS}


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def keys(**limits: Any) -> list[dict[str, Any]]:
    return [{"name": "alice", "key": KEY, **limits}]


# ---- the count ----------------------------------------------------------------------------
def test_the_docs_say_the_estimate_the_router_reserves():
    root = Path(__file__).resolve().parent.parent
    assert f"or **{OUTPUT_ESTIMATE} tokens** for the answer" in (root / "docs/operations.md").read_text()
    assert f"else {OUTPUT_ESTIMATE} for the answer" in (root / "docs/configuration.md").read_text()
    assert f"{HOLD_S / 60:g} minutes" in (root / "docs/operations.md").read_text()


def test_what_a_request_reserves():
    def reserved(path: str, body: dict[str, Any]) -> int:
        return reservation(parse(path, json.dumps(body).encode(), 0.0))

    text = "y" * 400  # 100 tokens at 4 characters a token
    messages = [{"role": "user", "content": text}]  # (+ "user": 101 tokens)
    assert reserved("/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 7}) == 108
    assert reserved("/v1/chat/completions", {"model": "m", "messages": messages}) == 101 + OUTPUT_ESTIMATE
    assert reserved("/api/generate", {"model": "m", "prompt": text, "options": {"num_predict": 9}}) == 109
    assert reserved("/v1/embeddings", {"model": "m", "input": text}) == 100  # no answer of text


def test_a_reservation_counts_until_it_is_settled_to_what_was_used():
    lim, limits = Limiter(), Limits(tpm=100, tokens_per_day=1000)
    holds = []
    for _ in range(12):  # twelve at once, none ended: admitted while spent + reserved < 100
        v = lim.admit("a", limits, 0.0, reserve=30)
        if v.refused is None:
            holds.append(v.hold)
    assert len(holds) == 4 and v.refused == "tpm" and v.held == 120 and v.retry_after == 1.0
    for hold in holds:  # each used 5 of its 30: the rest is given back
        lim.spend("a", 5, limits, 1.0, hold, 30)
    v = lim.admit("a", limits, 2.0, count=False)
    assert (v.tokens, v.day_tokens, v.held, v.refused) == (20, 20, 0, None)
    lim.spend("a", 5, limits, 3.0, holds[0], 30)  # settled twice: the second only spends
    assert lim.admit("a", limits, 3.0, count=False).held == 0
    lost = lim.admit("a", limits, 4.0, reserve=999).hold  # never settled (its process died)
    assert lim.admit("a", limits, 5.0, count=False).held == 999
    assert lim.admit("a", limits, 4.0 + HOLD_S + 1, count=False).held == 0  # not for ever
    assert lost


def test_the_daily_budget_held_by_requests_in_progress_is_not_called_spent():
    lim, limits = Limiter(), Limits(tokens_per_day=50)
    first = lim.admit("a", limits, 0.0, reserve=60)
    assert first.refused is None  # nothing spent or reserved yet: admitted
    v = lim.admit("a", limits, 1.0, reserve=5)
    assert v.refused == "tokens_per_day" and v.day_tokens == 0 and v.retry_after == 1.0  # not midnight
    lim.spend("a", 55, limits, 2.0, first.hold, 60)
    v = lim.admit("a", limits, 3.0, reserve=5)
    assert v.refused == "tokens_per_day" and v.day_tokens == 55 and v.retry_after > 3600


def test_usage_rows_say_which_tokens_the_router_counted(tmp_path):
    """The usage store and the budgets' read-back over a real SQLite file."""
    path = str(tmp_path / "u.db")
    old = sqlite3.connect(path)  # a database of an earlier version: no relayed columns yet
    old.execute(
        "CREATE TABLE usage (day TEXT NOT NULL, model TEXT NOT NULL, endpoint TEXT NOT NULL, client TEXT NOT NULL, "
        "requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL "
        "DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (day, model, endpoint, client))"
    )
    old.execute("INSERT INTO usage VALUES ('2020-01-01', 'llama3', 'm0', 'alice', 1, 0, 1, 1)")
    old.commit()
    old.close()

    async def run() -> list[Any]:
        usage = SqliteUsage(Events(), path)
        await usage.start()
        for source, p, c in (("backend", 7, 3), ("relayed", 5, 4), (None, None, None)):
            rec = RequestRecord("r", "openai", "/v1/chat/completions", "llama3", True, "alice", endpoint="m0")
            rec.status, rec.prompt_tokens, rec.completion_tokens, rec.tokens_from = 200, p, c, source
            usage.add(rec)
        rows = await usage.rows()
        await usage.close()
        return rows

    [(before, counts_before), (row, counts)] = asyncio.run(run())
    assert before[0] == "2020-01-01" and counts_before == [1, 0, 1, 1, 0, 0]
    assert row[1:] == ("llama3", "m0", "alice")
    assert counts == [3, 0, 12, 7, 5, 4]  # requests, errors, prompt, completion, of which relayed
    seed = read_spent(path)
    assert seed.day_tokens == {"alice": 19} and sum(n for _, _, n in seed.recent) == 19


# ---- on the wire -------------------------------------------------------------------------
async def _burst(url: str, n: int, body: dict[str, Any] = CHAT) -> list[tuple[int, int]]:
    """n requests at once, each on its own connection: (status, tokens the answer used)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

        async def one() -> tuple[int, int]:
            async with s.post(url + "/v1/chat/completions", json=body, headers=auth()) as resp:
                data = await resp.json()
                return resp.status, data["usage"]["total_tokens"] if resp.status == 200 else 0

        return await asyncio.gather(*[one() for _ in range(n)])


async def test_concurrent_requests_pass_tpm_by_at_most_one_reservation_and_settle():
    async with run_mock(ttft_ms=0.0, tok_ms=30.0, tokens=40) as m:  # 10 tokens: 0.3 s each
        cfg = {"endpoints": endpoints(m, slots=16), "client_keys": keys(tpm=100)}
        async with run_router(cfg) as r:
            results = await _burst(r.url, 12)
            served = sum(t for st, t in results if st == 200)
            admitted = [st for st, _ in results].count(200)
            print(f"tpm 100, 12 at once: {admitted} admitted, {served} tokens served")
            assert 429 in [st for st, _ in results]
            assert served <= 100 + RESERVED  # at most one reservation over
            v = await r.router.store.admit("alice", r.router.rate_limits.by_client["alice"], count=False)
            assert v.held == 0 and v.tokens == served  # each settled to what it used
            assert m.stats()["requests_total"] == admitted


async def test_a_reservation_shows_in_the_headers_and_the_rest_is_given_back():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": keys(tpm=10_000)}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            big = {**CHAT, "max_tokens": 4000}  # reserves 4002; the mock answers 8 tokens
            async with s.post(r.url + "/v1/chat/completions", json=big, headers=auth()) as resp:
                used = (await resp.json())["usage"]["total_tokens"]
                assert resp.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 4002)
            unbounded = {k: v for k, v in CHAT.items() if k != "max_tokens"}
            async with s.post(r.url + "/v1/chat/completions", json=unbounded, headers=auth()) as resp:
                assert resp.status == 200
                assert resp.headers["x-ratelimit-remaining-tokens"] == str(10_000 - used - 2 - OUTPUT_ESTIMATE)
                used += (await resp.json())["usage"]["total_tokens"]
            async with s.post(r.url + "/v1/chat/completions", json={**big, "model": "nope"}, headers=auth()) as resp:
                assert resp.status == 404  # reserved, then answered with an error: charged nothing
            v = await r.router.store.admit("alice", r.router.rate_limits.by_client["alice"], count=False)
            assert (v.tokens, v.held) == (used, 0)


async def _spent_then_restart(cfg: dict[str, Any], count: int) -> None:
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for _ in range(count):
            async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                assert resp.status == 200
        async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
            assert resp.status == 429
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:  # the same database, or Redis
        async with s.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
            assert resp.status == 429, "the budget was forgotten on restart"
            err = (await resp.json())["error"]
            assert err["code"] == ("insufficient_quota" if "tokens_per_day" in str(cfg) else "rate_limit_exceeded")


async def test_a_restart_remembers_what_the_budgets_spent(tmp_path, redis_url):
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as m:  # 8 tokens and 1 or 2 of prompt an answer
        for n, limits in enumerate(({"tokens_per_day": 25}, {"tpm": 15})):
            db = str(tmp_path / f"usage-{n}.db")
            await _spent_then_restart({"endpoints": endpoints(m), "usage_db": db, "client_keys": keys(**limits)}, 3 - n)
        redis = {"endpoints": endpoints(m), "state": redis_url, "client_keys": keys(tokens_per_day=25)}
        await _spent_then_restart(redis, 3)


async def test_instances_on_one_redis_share_the_reservations(redis_url):
    async with run_mock(ttft_ms=0.0, tok_ms=30.0, tokens=40) as m:
        cfg = {"endpoints": endpoints(m, slots=16), "state": redis_url, "client_keys": keys(tpm=100)}
        async with run_router(cfg) as r1, run_router(cfg) as r2:
            results = [x for part in await asyncio.gather(_burst(r1.url, 6), _burst(r2.url, 6)) for x in part]
            served = sum(t for st, t in results if st == 200)
            print("2 instances on Redis, tpm 100, 12 at once:", [st for st, _ in results], served, "tokens served")
            assert 429 in [st for st, _ in results] and served <= 100 + RESERVED
            await asyncio.sleep(0.2)  # (the settlements are sent as the answers end, without waiting)
            v = await r1.router.store.admit("alice", r1.router.rate_limits.by_client["alice"], count=False)
            assert v.held == 0 and v.tokens == served


async def test_workers_keep_one_budget_and_remember_it_on_restart(tmp_path):
    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=30.0, tokens=40, parallel=64)) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "one", "max_concurrent": 64}],
            "usage_db": str(tmp_path / "usage.db"),
            "client_keys": keys(tpm=100, tokens_per_day=100),
        }
        with router_workers(cfg, 2) as (url, _):
            results = await _burst(url, 12)
            served = sum(t for st, t in results if st == 200)
            print("2 workers, tpm 100, 12 at once:", [st for st, _ in results], served, "tokens served")
            assert 429 in [st for st, _ in results] and served <= 100 + RESERVED
            admitted = [st for st, _ in results].count(200)
            while True:  # one after another until the day's budget is spent
                [(status, tokens)] = await _burst(url, 1)
                if status != 200:
                    break
                served, admitted = served + tokens, admitted + 1
            assert served <= 100 + RESERVED
        with router_workers(cfg, 2) as (url, _):  # the same usage database
            async with aiohttp.ClientSession() as s:
                async with s.post(url + "/v1/chat/completions", json=CHAT, headers=auth()) as resp:
                    assert resp.status == 429
                    assert (await resp.json())["error"]["code"] == "insufficient_quota"
        async with aiohttp.ClientSession() as s:
            stats = await (await s.get(m.url + "/mock/stats")).json()
        assert stats["requests_total"] == admitted  # no refused request reached it


async def test_usage_rows_and_the_usage_stream_say_whose_counts_they_are():
    async with run_mock(ttft_ms=0.0, tok_ms=0.0, tokens=8) as m:
        cfg = {"endpoints": endpoints(m), "admin_key": ADMIN, "client_keys": keys(tokens_per_day=10**6)}
        async with run_router(cfg) as r, httpx.AsyncClient(timeout=10) as c:
            async with c.stream("GET", r.url + "/api/usage-stream", headers=auth(ADMIN)) as events:
                lines = events.aiter_lines()
                assert (await anext(lines)).startswith("event: usage")
                resp = await c.post(r.url + "/v1/chat/completions", json=CHAT, headers=auth())
                assert resp.status_code == 200
                async for line in lines:
                    if line.startswith("data:") and '"request_id"' in line and '"status"' in line:
                        done = json.loads(line[5:])
                        break
            assert done["tokens_from"] == "backend" and done["completion_tokens"] == 8
            report = (await c.get(r.url + "/api/usage", headers=auth(ADMIN))).json()
            [row] = report["rows"]
            assert row["tokens_from"] == "backend" and row["relayed_completion_tokens"] == 0
            assert report["totals"]["completion_tokens"] == 8


async def test_client_cut_streams_are_charged_against_the_budget():
    """Cut after a few chunks: what reached the client is charged (counted as relayed, or,
    where nothing counted it, the reservation), never nothing."""
    async with run_mock(ttft_ms=0.0, tok_ms=40.0, tokens=200) as m:
        cfg = {"endpoints": endpoints(m), "admin_key": ADMIN, "client_keys": keys(tokens_per_day=10**6)}
        body = {**CHAT, "max_tokens": 100, "stream": True}
        async with run_router(cfg) as r:
            delivered = 0
            async with httpx.AsyncClient(timeout=10) as c:
                for _ in range(3):
                    async with c.stream("POST", r.url + "/v1/chat/completions", json=body, headers=auth()) as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: {") and '"content"' in line:
                                delivered += 1
                                if delivered % 5 == 0:
                                    break  # the client closes the stream
                for _ in range(100):  # (each record ends when the router sees the client gone)
                    await r.router.rate_limits.refresh()
                    if r.router.rate_limits.last["alice"].held == 0:
                        break
                    await asyncio.sleep(0.05)
                charged = r.router.rate_limits.last["alice"].day_tokens
                print(f"3 cut streams: {delivered} content chunks delivered, {charged} tokens charged")
                assert charged >= delivered and r.router.rate_limits.last["alice"].held == 0
                await r.router.usage.flush()
                report = (await c.get(r.url + "/api/usage", headers=auth(ADMIN))).json()
            [row] = report["rows"]
            assert row["completion_tokens"] >= delivered, "the relay did not count the cut streams"
            assert row["tokens_from"] == "relayed"
