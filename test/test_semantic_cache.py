"""The response cache's semantic mode on real sockets: a question worded otherwise finds the
answer kept for a close one, embedded by an embedding model the router reaches through its own
endpoints (a small bag-of-words backend here); the namespace (client key, system prompt,
parameters), personal data, SQLite across a restart, and misses."""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mock import free_port, run_mock
from nomyo_router.cache import semantic
from test.conftest import FAST
from test.helpers import endpoints, run_router

DIM = 256
USE = {"nomyo": {"cache": True}}
STOP = {"the", "a", "an", "and", "of", "is", "what", "whats", "s", "me", "tell", "please", "city", "do", "does", "how"}


def embed(text: str) -> list[float]:
    """Bag of words, hashed: texts sharing their content words are close."""
    v = [0.0] * DIM
    for w in re.findall(r"[a-z]+", text.lower()):
        if w not in STOP:
            v[int(hashlib.md5(w.encode()).hexdigest(), 16) % DIM] += 1.0
    n = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / n for x in v]


class Embedder:
    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, request: web.Request) -> web.Response:
        self.calls += 1
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return web.json_response({"model": body["model"], "embeddings": [embed(t) for t in texts]})


async def _tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": "embedder:latest", "model": "embedder:latest"}]})


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.12.0"})


@contextlib.asynccontextmanager
async def embedder() -> AsyncIterator[tuple[Embedder, str]]:
    e = Embedder()
    app = web.Application()
    app.router.add_post("/api/embed", e.embed)
    for path in ("/api/tags", "/api/ps"):
        app.router.add_get(path, _tags)
    app.router.add_get("/api/version", _version)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield e, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def config(m: Any, url: str, **cache: Any) -> dict[str, Any]:
    return {
        "endpoints": [*endpoints(m), {"url": url, "name": "emb", "type": "ollama", "models": ["embedder"]}],
        "cache": {"enabled": True, "similarity": 0.8, "embed_model": "embedder", **cache},
    }


def chat(question: str, system: str = "You are terse.", **extra: Any) -> dict[str, Any]:
    return {
        "model": "llama3",
        "stream": False,
        **USE,
        **extra,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


async def ask(s: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    async with s.post(url + "/api/chat", json=body, headers=headers or {}) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Router-Response-Cache"]


async def test_a_question_worded_otherwise_finds_the_answer_and_others_do_not():
    async with run_mock(**FAST) as m, embedder() as (e, url):
        async with run_router(config(m, url)) as r:
            async with aiohttp.ClientSession() as s:
                assert await ask(s, r.url, chat("What is the capital of France?")) == "miss"
                assert await ask(s, r.url, chat("Tell me the capital city of France, please")) == "hit"
                assert await ask(s, r.url, chat("How do volcanoes form?")) == "miss"
                assert await ask(s, r.url, chat("what's the capital of france")) == "hit"
                # alike in everything else only: another system prompt, parameters, or key
                assert await ask(s, r.url, chat("What is the capital of France?", system="Answer in German.")) == "miss"
                assert await ask(s, r.url, chat("The capital of France?", options={"temperature": 0})) == "miss"
                # only the last user turn is compared by meaning: another history is another request
                longer = chat("and the capital of France?")
                longer["messages"][1:1] = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
                assert await ask(s, r.url, longer) == "miss"
                async with s.get(r.url + "/api/cache/stats") as resp:
                    stats = await resp.json()
    assert m.stats()["requests"]["/api/chat"] == 5
    assert stats["mode"] == "semantic" and stats["hits"] == 2 and stats["misses"] == 5
    assert e.calls == 7  # one embedding per lookup that missed exactly


def turns(last: Any, *before: dict[str, Any], after: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A chat: the system prompt, `before`, the last user turn (`last`: its content), `after`."""
    body = chat("")
    body["messages"] = [body["messages"][0], *before, {"role": "user", "content": last}, *after]
    return body


CALL = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather", "arguments": {}}}]}


async def test_everything_but_the_last_user_turn_s_text_must_match_exactly():
    """Images, tool results, a prefill, older history and sampling parameters change the
    answer: a request that differs in any of them is never served another's answer, though its
    question is worded alike; the same request worded otherwise still is."""
    hello = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    gif = {"type": "image_url", "image_url": {"url": "data:image/gif;base64,BBBB"}}
    q, q2 = "What is the weather in Paris?", "Tell me the weather in Paris, please"
    pairs = [  # (kept, asked): alike in the question, not in what else changes the answer
        (turns(q, *hello), turns(q2, {"role": "user", "content": "hey"}, {"role": "assistant", "content": "hi"})),
        (
            turns(q, after=(CALL, {"role": "tool", "content": "20 C"})),
            turns(q2, after=(CALL, {"role": "tool", "content": "-5 C"})),
        ),
        (
            turns(q, after=({"role": "assistant", "content": "Sure:"},)),
            turns(q2, after=({"role": "assistant", "content": "No:"},)),
        ),
        (
            {**turns(q), "messages": [*turns(q)["messages"][:-1], {"role": "user", "content": q, "images": ["AAAA"]}]},
            {
                **turns(q2),
                "messages": [*turns(q2)["messages"][:-1], {"role": "user", "content": q2, "images": ["BBBB"]}],
            },
        ),
        ({**turns(q), "options": {"temperature": 0.1}}, {**turns(q2), "options": {"temperature": 1.5}}),
    ]
    async with run_mock(**FAST) as m, embedder() as (e, url):
        async with run_router(config(m, url)) as r:
            async with aiohttp.ClientSession() as s:
                for kept, asked in pairs:
                    assert await ask(s, r.url, kept) == "miss"
                    assert await ask(s, r.url, asked) == "miss", asked
                    assert await ask(s, r.url, {**kept, "messages": [*kept["messages"]]}) == "hit"  # (the same)
                # the same history, the question worded otherwise: found by meaning
                assert await ask(s, r.url, turns(q2, *hello)) == "hit"
                # OpenAI content parts: text compared by meaning, the image exactly
                oa = [(png, "miss"), (gif, "miss"), (png, "hit")]
                for i, (image, want) in enumerate(oa):
                    text = q if i == 0 else q2
                    body = {**turns([{"type": "text", "text": text}, image]), "stream": False}
                    async with s.post(r.url + "/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200 and resp.headers["X-Router-Response-Cache"] == want, (i, want)


async def test_personal_questions_are_kept_for_exact_hits_only():
    async with run_mock(**FAST) as m, embedder() as (e, url):
        async with run_router(config(m, url)) as r:
            async with aiohttp.ClientSession() as s:
                q = "What is the capital of France? Mail it to bob@example.com"
                assert await ask(s, r.url, chat(q)) == "miss"
                assert await ask(s, r.url, chat("capital of France, mail to bob@example.com")) == "miss"
                assert await ask(s, r.url, chat(q)) == "hit"  # the same question, exactly


def test_what_counts_as_personal():
    assert semantic.personal("write to ann.lee+x@mail.example.org")
    assert semantic.personal("order 123e4567-e89b-12d3-a456-426614174000")
    assert semantic.personal("card 4111 1111 1111 1111") and semantic.personal("id 12345678")
    assert not semantic.personal("in 1789, 3 of 7 estates") and not semantic.personal("capital: Paris")


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_client_keys_never_share_and_sqlite_finds_them_after_a_restart(tmp_path, backend):
    keys = [{"name": "alice", "key": "alice-key-123"}, {"name": "bob", "key": "bob-key-12345"}]
    alice, bob = {"Authorization": "Bearer alice-key-123"}, {"Authorization": "Bearer bob-key-12345"}
    cfg_cache = {"backend": backend, "path": str(tmp_path / "c.db")}
    async with run_mock(**FAST) as m, embedder() as (e, url):
        async with run_router({**config(m, url, **cfg_cache), "client_keys": keys}) as r:
            async with aiohttp.ClientSession() as s:
                assert await ask(s, r.url, chat("What is the capital of France?"), alice) == "miss"
                assert await ask(s, r.url, chat("the capital of France?"), bob) == "miss"
        async with run_router({**config(m, url, **cfg_cache), "client_keys": keys}) as r:
            async with aiohttp.ClientSession() as s:
                want = "hit" if backend == "sqlite" else "miss"
                assert await ask(s, r.url, chat("Capital city of France"), alice) == want
                assert await ask(s, r.url, chat("France: its capital"), bob) == want


async def test_without_the_embedding_model_the_cache_stays_exact():
    async with run_mock(**FAST) as m, embedder() as (e, url):
        async with run_router(config(m, url, embed_model="nosuch")) as r:
            async with aiohttp.ClientSession() as s:
                assert await ask(s, r.url, chat("What is the capital of France?")) == "miss"
                assert await ask(s, r.url, chat("The capital of France?")) == "miss"
                assert await ask(s, r.url, chat("What is the capital of France?")) == "hit"


async def test_redis_finds_by_meaning_what_another_router_kept(redis_url):
    async with run_mock(**FAST) as m, embedder() as (e, url):
        cfg = config(m, url, backend="redis")
        cfg["cache"]["url"] = redis_url
        async with run_router(cfg) as a, run_router(cfg) as b:
            async with aiohttp.ClientSession() as s:
                assert await ask(s, a.url, chat("What is the capital of France?")) == "miss"
                assert await ask(s, b.url, chat("the capital city of France")) == "hit"
                assert await ask(s, b.url, chat("How do volcanoes form?")) == "miss"
                assert await ask(s, a.url, chat("so how do volcanoes form")) == "hit"
                async with s.post(a.url + "/api/cache/clear") as resp:
                    assert (await resp.json())["cleared"] == 2
                assert await ask(s, b.url, chat("What's the capital of France")) == "miss"
    assert m.stats()["requests"]["/api/chat"] == 3
