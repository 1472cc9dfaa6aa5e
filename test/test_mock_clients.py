"""The official ollama and openai clients parse every mock route, streaming and not."""

from __future__ import annotations

import ollama
import pytest

from mock.text import WORDS

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


async def test_ollama_chat_stream_equals_nonstream(mock, clients):
    c = clients.ollama(mock.url)
    full = await c.chat(model="llama3", messages=MSGS, stream=False)
    parts = [p async for p in await c.chat(model="llama3", messages=MSGS, stream=True)]
    assert full.message.content == "".join(p.message.content for p in parts)
    assert full.message.content.split() == list(WORDS[:8])
    last = parts[-1]
    assert last.done and last.done_reason == "stop" and last.eval_count == 8
    assert last.prompt_eval_count == full.prompt_eval_count > 0
    assert isinstance(last.total_duration, int)
    assert not any(p.done for p in parts[:-1])


async def test_ollama_generate_and_num_predict(mock, clients):
    c = clients.ollama(mock.url)
    full = await c.generate(model="llama3", prompt="hi", options={"num_predict": 3})
    parts = [p async for p in await c.generate(model="llama3", prompt="hi", stream=True, options={"num_predict": 3})]
    assert full.response == "".join(p.response for p in parts) == "lorem ipsum dolor "
    assert full.done_reason == parts[-1].done_reason == "length"
    assert full.eval_count == 3


async def test_ollama_embed_show_tags_ps_version(mock, clients):
    c = clients.ollama(mock.url)
    e = await c.embed(model="llama3", input=["a", "b"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 64
    assert e.embeddings[0] != e.embeddings[1]
    legacy = await c.embeddings(model="llama3", prompt="a")
    assert list(legacy.embedding) == list(e.embeddings[0])
    show = await c.show("llama3")
    assert show.details.family == "llama3"
    tags = await c.list()
    assert [m.model for m in tags.models] == ["llama3:latest", "qwen2.5:7b"]
    ps = await c.ps()
    assert len(ps.models) == 2
    assert (await c._request_raw("GET", "/api/version")).json()["version"]


async def test_ollama_unknown_model_is_404(mock, clients):
    c = clients.ollama(mock.url)
    with pytest.raises(ollama.ResponseError) as e:
        await c.chat(model="nope", messages=MSGS, stream=False)
    assert e.value.status_code == 404


async def test_openai_chat_stream_equals_nonstream(mock, clients):
    c = clients.openai(mock.url)
    full = await c.chat.completions.create(model="llama3", messages=MSGS)
    stream = await c.chat.completions.create(
        model="llama3", messages=MSGS, stream=True, stream_options={"include_usage": True}
    )
    chunks = [ch async for ch in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert not chunks[0].choices[0].delta.content
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["stop"] == [full.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 8


async def test_openai_completions_max_tokens(mock, clients):
    c = clients.openai(mock.url)
    full = await c.completions.create(model="llama3", prompt="hi", max_tokens=2)
    parts = [ch async for ch in await c.completions.create(model="llama3", prompt="hi", max_tokens=2, stream=True)]
    assert full.choices[0].text == "".join(p.choices[0].text for p in parts) == "lorem ipsum "
    assert full.choices[0].finish_reason == "length"


async def test_openai_embeddings_and_models(mock, clients):
    c = clients.openai(mock.url)
    e = await c.embeddings.create(model="llama3", input=["x", "y"])
    assert [d.index for d in e.data] == [0, 1] and len(e.data[0].embedding) == 64
    models = await c.models.list()
    assert [m.id for m in models.data] == ["llama3", "qwen2.5:7b"]
