"""Every route, streaming and not, through pass-through and through translation, with the
official clients; content must equal what the mock gives directly."""

from __future__ import annotations

import aiohttp
import ollama
import openai
import pytest

from mock import run_mock
from nomyo_router.domain import model_key
from test.conftest import FAST
from test.helpers import endpoints, run_router

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(params=["ollama", "openai"])
async def setup(request):
    """(router url, mock url) with the mock declared as an Ollama or an OpenAI-type backend."""
    async with run_mock(**FAST) as m:
        async with run_router({"endpoints": endpoints(m, type=request.param)}) as r:
            yield r.url, m.url, request.param


async def test_ollama_chat_and_generate(setup, clients):
    router, direct, kind = setup
    for fn, kwargs, field in (
        ("chat", {"messages": MSGS}, "message"),
        ("generate", {"prompt": "hi", "options": {"num_predict": 3}}, "response"),
    ):
        want = await getattr(clients.ollama(direct), fn)(model="llama3", stream=False, **kwargs)
        c = clients.ollama(router)
        got = await getattr(c, fn)(model="llama3", stream=False, **kwargs)
        parts = [p async for p in await getattr(c, fn)(model="llama3", stream=True, **kwargs)]
        text = lambda r, field=field: r.message.content if field == "message" else r.response  # noqa: E731
        assert text(got) == text(want) == "".join(text(p) for p in parts)
        assert parts[-1].done and parts[-1].done_reason == want.done_reason
        assert got.eval_count == parts[-1].eval_count == want.eval_count
        assert got.prompt_eval_count == want.prompt_eval_count


async def test_ollama_stream_is_the_default(setup):
    router, _, _ = setup
    async with aiohttp.ClientSession() as s:
        async with s.post(router + "/api/chat", json={"model": "llama3", "messages": MSGS}) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
            lines = [line async for line in r.content if line.strip()]
    assert len(lines) == 9  # 8 tokens + the done chunk


async def test_ollama_embeddings(setup, clients):
    router, direct, _ = setup
    want = await clients.ollama(direct).embed(model="llama3", input=["a", "b"])
    got = await clients.ollama(router).embed(model="llama3", input=["a", "b"])
    assert got.embeddings == want.embeddings
    legacy = await clients.ollama(router).embeddings(model="llama3", prompt="a")
    assert list(legacy.embedding) == list(want.embeddings[0])


async def test_openai_routes(setup, clients):
    router, direct, _ = setup
    c, d = clients.openai(router), clients.openai(direct)
    want = await d.chat.completions.create(model="llama3", messages=MSGS)
    got = await c.chat.completions.create(model="llama3", messages=MSGS)
    assert got.choices[0].message.content == want.choices[0].message.content
    chunks = [
        ch
        async for ch in await c.chat.completions.create(
            model="llama3", messages=MSGS, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 8
    comp = await c.completions.create(model="llama3", prompt="hi", max_tokens=2)
    parts = [p async for p in await c.completions.create(model="llama3", prompt="hi", max_tokens=2, stream=True)]
    assert comp.choices[0].text == "".join(p.choices[0].text for p in parts) == "lorem ipsum "
    emb = await c.embeddings.create(model="llama3", input="x")
    assert emb.data[0].embedding == (await d.embeddings.create(model="llama3", input="x")).data[0].embedding
    ids = [model_key(m.id) for m in (await c.models.list()).data]
    assert ids == [model_key(m.id) for m in (await d.models.list()).data]


async def test_listing_routes_merge_endpoints(clients):
    async with run_mock(**FAST, models=["llama3", "a:1"]) as m1, run_mock(**FAST, models=["llama3:latest", "b"]) as m2:
        async with run_router({"endpoints": endpoints(m1, m2)}) as r:
            c = clients.ollama(r.url)
            names = sorted(m.model for m in (await c.list()).models)
            assert names == ["a:1", "b:latest", "llama3:latest"]
            assert len((await c.ps()).models) == 3
            show = await c.show("b")
            assert show.details.family == "b"
            ids = sorted(m.id for m in (await clients.openai(r.url).models.list()).data)
            assert len(ids) == 3
            async with aiohttp.ClientSession() as s:
                async with s.get(r.url + "/api/version") as v:
                    assert (await v.json())["version"]


async def test_unknown_model_is_404_in_each_shape(setup, clients):
    router, _, _ = setup
    with pytest.raises(ollama.ResponseError) as e:
        await clients.ollama(router).chat(model="nope", messages=MSGS, stream=False)
    assert e.value.status_code == 404
    with pytest.raises(openai.NotFoundError) as e2:
        await clients.openai(router).chat.completions.create(model="nope", messages=MSGS)
    assert e2.value.body["code"] == "model_not_found"


async def test_name_and_latest_match(clients):
    async with run_mock(**FAST, models=["llama3:latest"]) as m:
        async with run_router({"endpoints": endpoints(m, type="openai")}) as r:
            got = await clients.openai(r.url).chat.completions.create(model="llama3", messages=MSGS)
            assert got.choices[0].message.content
            got2 = await clients.ollama(r.url).chat(model="llama3:latest", messages=MSGS, stream=False)
            assert got2.message.content == got.choices[0].message.content


async def test_models_are_described_by_their_backends_and_retrievable(mock, clients):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        oa = clients.openai(r.url)
        listed = {m.id: m for m in (await oa.models.list()).data}
        assert listed["llama3:latest"].owned_by == "library"
        one = await oa.models.retrieve("llama3")
        assert one.id == "llama3" and one.created == listed["llama3:latest"].created
        with pytest.raises(openai.NotFoundError):
            await oa.models.retrieve("nope")
        async with aiohttp.ClientSession() as s:
            for path in ("/api/version", "/api/tags", "/"):
                async with s.head(r.url + path) as resp:
                    assert resp.status == 200


async def test_a_model_added_on_a_backend_is_served_at_once(mock):
    async with (
        run_router({"endpoints": endpoints(mock), "model_refresh_interval": 3600}) as r,
        aiohttp.ClientSession() as s,
    ):
        mock.update(models=["llama3", "qwen2.5:7b", "fresh"])
        body = {"model": "fresh", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(r.url + "/api/chat", json=body) as resp:
            assert resp.status == 200  # not a 404 for up to model_refresh_interval


async def test_every_backend_down_is_503_not_404():
    from mock import free_port

    dead = {"url": f"http://127.0.0.1:{free_port()}", "name": "dead"}
    async with run_router({"endpoints": [dead], "connect_timeout": 0.5}) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/api/chat", json={"model": "llama3", "messages": []}) as resp:
            assert resp.status == 503 and "no healthy endpoint" in (await resp.json())["error"]


async def test_unload_reaches_every_endpoint_that_has_the_model_loaded(mock, mock2):
    async with run_router({"endpoints": endpoints(mock, mock2)}) as r, aiohttp.ClientSession() as s:
        before = [m.stats()["requests"].get("/api/chat", 0) for m in (mock, mock2)]
        async with s.post(r.url + "/api/chat", json={"model": "llama3", "messages": [], "keep_alive": 0}) as resp:
            assert resp.status == 200
        after = [m.stats()["requests"].get("/api/chat", 0) for m in (mock, mock2)]
        assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]  # both, not one
        async with s.get(r.url + "/health") as h:
            assert all(e["in_flight"] == 0 for e in (await h.json())["endpoints"])  # no slot taken


async def test_anthropic_messages_to_an_openai_only_backend_is_501_in_anthropics_shape(mock):
    cfg = {"endpoints": [{"url": mock.url, "name": "oa", "type": "openai", "models": ["llama3"]}]}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        body = {"model": "llama3", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(r.url + "/v1/messages", json=body) as resp:
            err = await resp.json()
            assert resp.status == 501 and err["type"] == "error" and "Ollama backends" in err["error"]["message"]
        async with s.post(r.url + "/v1/messages", json={"max_tokens": 8}) as resp:
            assert resp.status == 400 and (await resp.json())["type"] == "error"
