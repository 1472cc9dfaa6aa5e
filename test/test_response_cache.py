"""The response cache, exact mode, on real sockets: a backend that counts its calls, hits and
misses on every cacheable route whole and streamed, streams from the cache read by the
official clients, what the key covers, key isolation, SQLite across a restart, Redis across
two routers, bounds, and the operator routes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import ollama
import pytest

from mock import run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

ON = {"enabled": True}
USE = {"nomyo": {"cache": True}}
MSGS = [{"role": "user", "content": "Why is the sky blue?"}]
BODIES: dict[str, dict[str, Any]] = {
    "/api/chat": {"messages": MSGS},
    "/api/generate": {"prompt": "hi"},
    "/v1/chat/completions": {"messages": MSGS},
    "/v1/completions": {"prompt": "hi"},
    "/api/embed": {"input": "hi"},
    "/api/embeddings": {"prompt": "hi"},
    "/v1/embeddings": {"input": "hi"},
}


def calls(m: Any, path: str) -> int:
    return m.stats()["requests"].get(path, 0)


async def post(
    s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, str | None, bytes]:
    async with s.post(url + path, json=body, headers=headers or {}) as r:
        return r.status, r.headers.get("X-Router-Response-Cache"), await r.read()


def text_of(path: str, stream: bool, data: bytes) -> str:
    """The answer's text, whatever its shape."""
    if "embed" in path:
        obj = json.loads(data)
        return json.dumps(obj.get("embeddings") or obj.get("embedding") or [d["embedding"] for d in obj["data"]])
    if path.startswith("/v1/"):
        if not stream:
            c = json.loads(data)["choices"][0]
            return c["message"]["content"] if "chat" in path else c["text"]
        out = []
        for line in data.decode().splitlines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    out.append((c.get("delta") or {}).get("content") or c.get("text") or "")
        assert data.rstrip().endswith(b"data: [DONE]")
        return "".join(out)
    records = [json.loads(x) for x in data.splitlines() if x.strip()]
    assert records[-1]["done"] is True
    field = "message" if "chat" in path else "response"
    return "".join((r[field]["content"] if field == "message" else r[field]) for r in records)


@pytest.fixture
async def cached():
    async with run_mock(**FAST) as m:
        async with run_router({"endpoints": endpoints(m), "cache": ON}) as r:
            async with aiohttp.ClientSession() as s:
                yield m, r, s


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_hit_is_answered_without_a_backend_in_both_shapes(cached, path):
    m, r, s = cached
    embed = "embed" in path
    first_stream = not embed
    body = {"model": "llama3", **BODIES[path], **USE}
    status, header, data = await post(s, r.url, path, {**body, "stream": first_stream} if not embed else body)
    assert (status, header) == (200, "miss")
    want = text_of(path, first_stream, data)
    assert calls(m, path) == 1
    for stream in (False, True) if not embed else (False,):  # stored from a stream, served both ways
        status, header, data = await post(s, r.url, path, {**body, "stream": stream} if not embed else body)
        assert (status, header) == (200, "hit")
        assert text_of(path, stream, data) == want
    assert calls(m, path) == 1


async def test_without_opting_in_every_request_reaches_a_backend(cached):
    m, r, s = cached
    body = {"model": "llama3", "messages": MSGS, "stream": False}
    for _ in range(3):
        status, header, _ = await post(s, r.url, "/api/chat", body)
        assert status == 200 and header is None
    assert calls(m, "/api/chat") == 3


def spy(m: Any, path: str) -> list[dict[str, Any]]:
    """The bodies the backend gets on `path`, from now on."""
    seen: list[dict[str, Any]] = []
    route = m.backend.routes[("POST", path)]

    async def spying(request: Any) -> Any:
        seen.append(json.loads(await request.read()))
        return await route(request)

    m.backend.routes[("POST", path)] = spying
    return seen


async def test_the_header_opts_in_and_the_body_field_never_reaches_the_backend(cached):
    m, r, s = cached
    seen = spy(m, "/v1/chat/completions")
    body = {"model": "llama3", "messages": MSGS}
    assert (await post(s, r.url, "/v1/chat/completions", body, {"X-Router-Response-Cache": "use"}))[1] == "miss"
    assert (await post(s, r.url, "/v1/chat/completions", {**body, **USE}))[1] == "hit"
    assert (await post(s, r.url, "/v1/chat/completions", {**body, "nomyo": {"cache": False}}))[1] is None
    assert len(seen) == 2 and all("nomyo" not in b for b in seen)


async def test_the_key_is_the_whole_canonical_request(cached):
    m, r, s = cached
    raw = (
        b'{"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "temperature": 1, '
        b'"nomyo": {"cache": true}}'
    )
    async with s.post(r.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}) as resp:
        assert resp.headers["X-Router-Response-Cache"] == "miss"
    same = {
        "temperature": 1.0,
        "nomyo": {"cache": True},
        "messages": [{"content": "hi", "role": "user"}],
        "model": "llama3:latest",
        "stream": False,
    }  # other order, spacing, 1.0, the full model name
    assert (await post(s, r.url, "/v1/chat/completions", same))[1] == "hit"
    for change in (
        {"temperature": 0.5},
        {"seed": 3},
        {"max_tokens": 4},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"messages": [{"role": "user", "content": "hi!"}]},
    ):
        assert (await post(s, r.url, "/v1/chat/completions", {**same, **change}))[1] == "miss", change
    assert calls(m, "/v1/chat/completions") == 6
    # another route with the same body is another question
    assert (await post(s, r.url, "/api/chat", {**same, "stream": False}))[1] == "miss"


async def test_log_probabilities_and_failed_answers_are_not_kept(cached):
    m, r, s = cached
    body = {"model": "llama3", "messages": MSGS, "logprobs": True, **USE}
    for _ in range(2):
        assert (await post(s, r.url, "/v1/chat/completions", body))[1] == "bypass"
    m.update(fail_rate=1.0)
    body = {"model": "llama3", "messages": MSGS, "stream": False, **USE}
    status, header, _ = await post(s, r.url, "/api/chat", body)
    assert status == 500 and header == "miss"
    m.update(fail_rate=0.0)
    assert (await post(s, r.url, "/api/chat", body))[1] == "miss"  # the failure was not kept
    assert (await post(s, r.url, "/api/chat", body))[1] == "hit"


async def test_streams_from_the_cache_read_by_the_official_clients(cached, clients):
    m, r, _ = cached
    oa = clients.openai(r.url)
    want = (await oa.chat.completions.create(model="llama3", messages=MSGS, extra_body=USE)).choices[0].message.content
    parts = [
        c
        async for c in await oa.chat.completions.create(
            model="llama3", messages=MSGS, stream=True, stream_options={"include_usage": True}, extra_body=USE
        )
    ]
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == want
    assert parts[-1].usage is not None and parts[-1].usage.completion_tokens == 8
    resp = await oa.chat.completions.with_raw_response.create(model="llama3", messages=MSGS, extra_body=USE)
    assert resp.headers["x-router-response-cache"] == "hit"
    assert calls(m, "/v1/chat/completions") == 1

    ol = ollama.AsyncClient(host=r.url, headers={"X-Router-Response-Cache": "use"})
    try:
        whole = await ol.chat(model="llama3", messages=MSGS, stream=False)
        streamed = [p async for p in await ol.chat(model="llama3", messages=MSGS, stream=True)]
        gen = [p async for p in await ol.generate(model="llama3", prompt="hi", stream=True)]
        gen_again = await ol.generate(model="llama3", prompt="hi", stream=False)
    finally:
        await ol.close()
    assert "".join(p.message.content for p in streamed) == whole.message.content
    assert streamed[-1].done and streamed[-1].eval_count == whole.eval_count == 8
    assert "".join(p.response for p in gen) == gen_again.response and gen_again.done
    assert calls(m, "/api/chat") == 1 and calls(m, "/api/generate") == 1


async def test_identical_requests_in_flight_are_answered_once():
    async with run_mock(ttft_ms=200, tok_ms=0, tokens=8) as m:
        async with run_router({"endpoints": endpoints(m), "cache": ON}) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "llama3", "messages": MSGS, "stream": True, **USE}
                got = await asyncio.gather(*(post(s, r.url, "/api/chat", body) for _ in range(5)))
    assert sorted(h for _, h, _ in got) == ["hit"] * 4 + ["miss"]
    assert len({text_of("/api/chat", True, d) for _, _, d in got}) == 1
    assert calls(m, "/api/chat") == 1


async def test_client_keys_never_share_answers():
    keys = [{"name": "alice", "key": "alice-key-123"}, {"name": "bob", "key": "bob-key-12345"}]
    async with run_mock(**FAST) as m:
        async with run_router({"endpoints": endpoints(m), "cache": ON, "client_keys": keys}) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "llama3", "messages": MSGS, "stream": False, **USE}
                alice, bob = ({"Authorization": "Bearer alice-key-123"}, {"Authorization": "Bearer bob-key-12345"})
                assert (await post(s, r.url, "/api/chat", body, alice))[1] == "miss"
                assert (await post(s, r.url, "/api/chat", body, bob))[1] == "miss"
                assert (await post(s, r.url, "/api/chat", body, alice))[1] == "hit"
                assert (await post(s, r.url, "/api/chat", body, bob))[1] == "hit"
    assert calls(m, "/api/chat") == 2


async def test_sqlite_keeps_answers_across_a_restart(tmp_path):
    cache = {**ON, "backend": "sqlite", "path": str(tmp_path / "cache.db")}
    body = {"model": "llama3", "messages": MSGS, "stream": True, **USE}
    async with run_mock(**FAST) as m:
        for want in ("miss", "hit"):
            async with run_router({"endpoints": endpoints(m), "cache": cache}) as r:
                async with aiohttp.ClientSession() as s:
                    assert (await post(s, r.url, "/api/chat", body))[1] == want
        assert calls(m, "/api/chat") == 1
    assert oct((tmp_path / "cache.db").stat().st_mode & 0o777) == "0o600"


async def test_redis_shares_answers_between_two_routers(redis_url):
    cache = {**ON, "backend": "redis", "url": redis_url}
    body = {"model": "llama3", "messages": MSGS, **USE}
    async with run_mock(**FAST) as m:
        async with (
            run_router({"endpoints": endpoints(m), "cache": cache}) as a,
            run_router({"endpoints": endpoints(m), "cache": cache}) as b,
        ):
            async with aiohttp.ClientSession() as s:
                status, header, data = await post(s, a.url, "/v1/chat/completions", body)
                assert header == "miss"
                status, header, again = await post(s, b.url, "/v1/chat/completions", {**body, "stream": True})
                assert (status, header) == (200, "hit")
                assert text_of("/v1/chat/completions", True, again) == text_of("/v1/chat/completions", False, data)
                async with s.get(b.url + "/api/cache/stats") as resp:
                    stats = await resp.json()
                assert stats["entries"] == 1 and stats["bytes"] > 0 and stats["hits"] == 1
                async with s.post(a.url + "/api/cache/clear") as resp:
                    assert (await resp.json())["cleared"] == 1
                assert (await post(s, b.url, "/v1/chat/completions", body))[1] == "miss"
        assert calls(m, "/v1/chat/completions") == 2


async def test_ttl_and_max_entries_bound_the_cache():
    async with run_mock(**FAST) as m:
        async with run_router({"endpoints": endpoints(m), "cache": {**ON, "ttl": 0.3, "max_entries": 2}}) as r:
            async with aiohttp.ClientSession() as s:

                def ask(n: int) -> dict[str, Any]:
                    return {"model": "llama3", "prompt": f"q{n}", "stream": False, **USE}

                for n in range(3):
                    assert (await post(s, r.url, "/api/generate", ask(n)))[1] == "miss"
                assert (await post(s, r.url, "/api/generate", ask(2)))[1] == "hit"
                assert (await post(s, r.url, "/api/generate", ask(0)))[1] == "miss"  # the oldest went first
                await asyncio.sleep(0.4)
                assert (await post(s, r.url, "/api/generate", ask(2)))[1] == "miss"  # expired
                async with s.get(r.url + "/api/cache/stats") as resp:
                    stats = await resp.json()
    assert stats["entries"] <= 2 and stats["hits"] == 1 and stats["misses"] == 5


async def test_the_operator_routes_need_the_admin_key_and_usage_counts_hits_apart(tmp_path):
    cfg = {
        "endpoints": [],
        "cache": ON,
        "admin_key": "admin-key-123",
        "usage_db": str(tmp_path / "u.db"),
        "client_keys": [{"name": "app", "key": "app-key-1234"}],
    }
    admin, app = {"Authorization": "Bearer admin-key-123"}, {"Authorization": "Bearer app-key-1234"}
    async with run_mock(**FAST) as m:
        cfg["endpoints"] = endpoints(m)
        async with run_router(cfg) as r:
            async with aiohttp.ClientSession() as s:
                for path, method in (("/api/cache/stats", s.get), ("/api/cache/clear", s.post)):
                    async with method(r.url + path) as resp:
                        assert resp.status == 401
                    async with method(r.url + path, headers=app) as resp:
                        assert resp.status == 403
                body = {"model": "llama3", "messages": MSGS, "stream": False, **USE}
                for _ in range(3):
                    await post(s, r.url, "/api/chat", body, app)
                async with s.get(r.url + "/api/cache/stats", headers=admin) as resp:
                    stats = await resp.json()
                assert (stats["hits"], stats["misses"], stats["entries"]) == (2, 1, 1)
                async with s.post(r.url + "/api/cache/clear", headers=admin) as resp:
                    assert (await resp.json()) == {"cleared": 1}
                async with s.get(r.url + "/api/usage", headers=admin) as resp:
                    usage = await resp.json()
    assert usage["by_endpoint"]["(cache)"]["requests"] == 2
    assert usage["by_endpoint"]["(cache)"]["completion_tokens"] == 0
    assert usage["by_endpoint"]["m0"]["requests"] == 1


async def test_when_the_cache_is_off_the_field_is_still_taken_out(mock):
    seen = spy(mock, "/api/chat")
    async with run_router({"endpoints": endpoints(mock)}) as r:
        async with aiohttp.ClientSession() as s:
            status, header, _ = await post(
                s, r.url, "/api/chat", {"model": "llama3", "messages": MSGS, "stream": False, **USE}
            )
            assert status == 200 and header is None
            async with s.get(r.url + "/api/cache/stats") as resp:
                assert resp.status == 404
    assert len(seen) == 1 and "nomyo" not in seen[0] and seen[0]["messages"] == MSGS
