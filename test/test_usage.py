"""Token accounting: persisted in SQLite (or Redis), exact across workers and restarts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from mock import MockConfig, MockProcess
from test.helpers import endpoints, run_router
from test.router_proc import router_workers
from test.waits import Calls

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


async def reported(resp: aiohttp.ClientResponse, path: str, stream: bool) -> int:
    """The completion tokens the backend reported in this answer."""
    body = await resp.read()
    assert resp.status == 200, body
    if path.startswith("/v1/"):
        if not stream:
            return json.loads(body)["usage"]["completion_tokens"]
        events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
        usage = [e["usage"] for e in events if e.get("usage")]
        return usage[-1]["completion_tokens"] if usage else 0
    return json.loads(body.splitlines()[-1])["eval_count"]


async def usage(s: aiohttp.ClientSession, url: str, key: str | None = None, **params: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with s.get(url + "/api/usage", params=params, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def until_total(s: aiohttp.ClientSession, url: str, tokens: int, requests: int) -> dict[str, Any]:
    """Each worker hands its batch on once a second: wait for every worker's share."""
    for _ in range(50):
        u = await usage(s, url)
        if u["totals"]["completion_tokens"] >= tokens and u["totals"]["requests"] >= requests:
            return u
        await asyncio.sleep(0.1)
    return u


async def test_usage_survives_a_restart_of_two_workers(tmp_path):
    db = str(tmp_path / "usage.db")
    cfg = {"endpoints": [{"url": "", "name": "m", "max_concurrent": 16}], "usage_db": db}
    with MockProcess(MockConfig(ttft_ms=0, tok_ms=0, tokens=5, parallel=64)) as m:
        cfg["endpoints"][0]["url"] = m.url
        expected = 0
        with router_workers(cfg, 2) as (url, _):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

                async def one(i: int) -> int:
                    stream = i % 5 < 2  # 40 streams, 60 not
                    path = "/v1/chat/completions" if i % 2 else "/api/chat"
                    body = {**CHAT, "stream": stream}
                    if stream and path.startswith("/v1/") and i % 4 == 1:
                        body["stream_options"] = {"include_usage": True}  # the others: counted all the same
                    async with s.post(url + path, json=body) as resp:
                        got = await reported(resp, path, stream)
                        return got if got or not stream or not path.startswith("/v1/") else 5

                counts = await asyncio.gather(*(one(i) for i in range(100)))
                expected = sum(counts)
                assert expected >= 100 * 5 * 0.5  # the backend answered with counts
                live = await until_total(s, url, expected, 100)
                assert live["totals"]["completion_tokens"] == expected
                assert live["totals"]["requests"] == 100
        with router_workers(cfg, 2) as (url, _):  # a new router on the same file
            async with aiohttp.ClientSession() as s:
                after = await usage(s, url)
                assert after["totals"]["completion_tokens"] == expected
                assert after["totals"]["requests"] == 100
                assert after["by_model"]["llama3"]["completion_tokens"] == expected
                assert after["by_endpoint"]["m"]["requests"] == 100
                async with s.get(url + "/api/usage", params={"format": "csv"}) as resp:
                    lines = (await resp.text()).splitlines()
                assert lines[0] == (
                    "day,model,endpoint,client,requests,errors,prompt_tokens,completion_tokens,"
                    "relayed_prompt_tokens,relayed_completion_tokens"
                )
                assert lines[1].split(",")[1:5] == ["llama3", "m", "", "100"]
                assert int(lines[1].split(",")[7]) == expected


async def test_each_client_key_sees_its_own_usage(mock, tmp_path):
    cfg = {
        "endpoints": endpoints(mock),
        "usage_db": str(tmp_path / "u.db"),
        "admin_key": "admin-key-123456",
        "client_keys": [{"name": "alice", "key": "alice-key-123456"}, {"name": "bob", "key": "bob-key-1234567"}],
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for key, n in (("alice-key-123456", 3), ("bob-key-1234567", 2)):
            for _ in range(n):
                async with s.post(
                    r.url + "/api/chat", json={**CHAT, "stream": False}, headers={"Authorization": f"Bearer {key}"}
                ) as resp:
                    assert resp.status == 200
        async with s.get(r.url + "/api/usage") as resp:
            assert resp.status == 401  # no key, no usage
        mine = await usage(s, r.url, "alice-key-123456")
        assert mine["totals"]["requests"] == 3 and set(mine["by_client"]) == {"alice"}
        everyone = await usage(s, r.url, "admin-key-123456")
        assert everyone["by_client"]["alice"]["requests"] == 3 and everyone["by_client"]["bob"]["requests"] == 2
        async with s.get(
            r.url + "/api/usage", params={"since": "yesterday"}, headers={"Authorization": "Bearer admin-key-123456"}
        ) as resp:
            assert resp.status == 400 and "YYYY-MM-DD" in (await resp.json())["error"]


async def test_usage_in_redis_adds_up_across_instances(mock, redis_url):
    import redis.asyncio as aioredis

    r0 = aioredis.from_url(redis_url)
    for key in await r0.keys("nomyo:usage:*"):
        await r0.delete(key)
    await r0.aclose()
    cfg = {"endpoints": endpoints(mock), "state": redis_url}
    async with run_router(cfg) as a, run_router(cfg) as b, aiohttp.ClientSession() as s:
        flushes = [Calls(r.router.store.usage, "flush") for r in (a, b)]
        for url in (a.url, a.url, b.url):
            async with s.post(url + "/api/chat", json={**CHAT, "stream": False}) as resp:
                assert resp.status == 200
        await asyncio.gather(*(f.next() for f in flushes))  # each instance's next flush to Redis
        for url in (a.url, b.url):
            assert (await usage(s, url))["totals"]["requests"] == 3


async def test_openai_streams_are_counted_without_showing_usage_the_client_did_not_ask(mock, tmp_path):
    """The router asks the backend for `include_usage` and strips that event again."""
    import openai

    body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as s:  # what the backend reports when asked, directly
        async with s.post(
            mock.url + "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}
        ) as resp:
            truth = await reported(resp, "/v1/chat/completions", True)
    assert truth > 0
    async with run_router({"endpoints": endpoints(mock), "usage_db": str(tmp_path / "u.db")}) as r:
        client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="unused")
        chunks = [c async for c in await client.chat.completions.create(**body)]
        assert chunks and all(c.usage is None and c.choices for c in chunks)  # no usage event
        asked = [c async for c in await client.chat.completions.create(**body, stream_options={"include_usage": True})]
        assert asked[-1].usage is not None and asked[-1].usage.completion_tokens == truth
        async with aiohttp.ClientSession() as s:
            u = await usage(s, r.url)
        await client.close()
    assert u["totals"]["completion_tokens"] == 2 * truth and u["totals"]["requests"] == 2


async def test_csv_cells_that_a_spreadsheet_would_run_are_made_text(tmp_path):
    """Client, model and endpoint names reach the CSV from the config and from backends; one
    that starts like a formula (`=`, `+`, `-`, `@`, tab, CR) gets a leading `'`, so opening the
    export in Excel or LibreOffice runs nothing."""
    import csv
    import io

    from mock import run_mock

    evil_client, evil_model = "=cmd|' /C calc'!A0", "+SUM(1;2)"
    async with run_mock(ttft_ms=0, tok_ms=0, tokens=4, models=[evil_model]) as m:
        cfg = {
            "endpoints": [{"url": m.url, "name": "@box"}],
            "usage_db": str(tmp_path / "u.db"),
            "client_keys": [
                {"name": evil_client, "key": "evil-key-123456"},
                {"name": "-tab", "key": "tab-key-1234567"},
            ],
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            for key in ("evil-key-123456", "tab-key-1234567"):
                async with s.post(
                    r.url + "/api/chat",
                    json={**CHAT, "model": evil_model, "stream": False},
                    headers={"Authorization": f"Bearer {key}"},
                ) as resp:
                    assert resp.status == 200, await resp.text()
            async with s.get(
                r.url + "/api/usage", params={"format": "csv"}, headers={"Authorization": "Bearer evil-key-123456"}
            ) as resp:
                assert resp.status == 200
                rows = list(csv.reader(io.StringIO(await resp.text())))
            everyone = await usage(s, r.url, "tab-key-1234567")  # JSON is data, not a sheet: as is
    assert rows[0] == [
        "day",
        "model",
        "endpoint",
        "client",
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "relayed_prompt_tokens",
        "relayed_completion_tokens",
    ]
    assert [row[1:5] for row in rows[1:]] == [["'" + evil_model, "'@box", "'" + evil_client, "1"]]
    assert everyone["rows"][0]["model"] == evil_model and everyone["rows"][0]["client"] == "-tab"


def test_to_csv_quotes_every_formula_start():
    from nomyo_router.ops.usage.routes import to_csv

    starts = ["=1", "+1", "-1", "@1", "\t1", "\r1"]
    out = to_csv([(("2024-01-01", s, "ep", "plain"), [1, 0, 2, 3, 0, 0]) for s in starts])
    import csv
    import io

    rows = list(csv.reader(io.StringIO(out.decode(), newline="")))
    assert [row[1] for row in rows[1:]] == ["'" + s for s in starts]
    assert all(row[2:4] == ["ep", "plain"] and row[4:] == ["1", "0", "2", "3", "0", "0"] for row in rows[1:])
