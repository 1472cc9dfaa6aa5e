"""The newer routes through the router with the official openai client, mocks as backends:
/v1/responses (stream and not, conversation affinity), /api/status, rerank (OpenAI-type
backends only: 501 otherwise), image generation, multipart audio transcriptions."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from mock import run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit "


@pytest.fixture
async def mixed():
    """a: Ollama-type (detected) with llama3; b: declared OpenAI-type with llama3 and rr."""
    async with run_mock(**FAST) as a, run_mock(**FAST, models=["llama3", "rr"]) as b:
        eps = [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b", "type": "openai"}]
        async with run_router({"endpoints": eps}) as r:
            yield a, b, r


async def test_responses_stream_and_not(mock, clients):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        client = clients.openai(r.url)
        resp = await client.responses.create(model="llama3", input="hello")
        assert resp.output_text == WORDS and resp.usage.output_tokens == 8
        events = [e async for e in await client.responses.create(model="llama3", input="hello", stream=True)]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == WORDS
        with pytest.raises(openai.BadRequestError) as e:
            await client.responses.create(model="llama3", input=5)
        assert e.value.body["param"] == "input"
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="nope", input="hi")
        assert mock.backend.requests["/v1/responses"] == 2


async def test_responses_conversations_keep_their_endpoint(mock, mock2):
    async with run_router({"endpoints": endpoints(mock, mock2)}) as r, aiohttp.ClientSession() as s:
        for n in range(3):
            items = [{"role": "user", "content": f"conversation {n}"}]
            seen = []
            for turn in range(4):
                async with s.post(
                    r.url + "/v1/responses", json={"model": "llama3", "input": items, "instructions": "be brief"}
                ) as resp:
                    body = await resp.json()
                    seen.append((resp.headers["X-Router-Endpoint"], resp.headers.get("X-Router-Affinity")))
                items = items + body["output"] + [{"role": "user", "content": f"more {turn}"}]
            assert [aff for _, aff in seen] == ["miss", "hit", "hit", "hit"]
            assert len({ep for ep, _ in seen}) == 1


async def test_api_status(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + "/api/status") as resp:
            assert resp.status == 200 and await resp.json() == {"cloud": {"disabled": True, "source": "env"}}
    async with run_router({"endpoints": [{"url": mock.url, "type": "openai"}]}) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + "/api/status") as resp:  # no Ollama endpoint: the router's own answer
            assert resp.status == 200 and (await resp.json())["cloud"]["disabled"] is True


async def test_rerank_goes_to_openai_type_backends_only(mixed):
    a, b, r = mixed
    async with aiohttp.ClientSession() as s:
        ask = {"model": "llama3", "query": "red apple", "documents": ["a red apple", "blue sky", "apple"]}
        for path in ("/v1/rerank", "/rerank") * 3:
            async with s.post(r.url + path, json=ask) as resp:
                assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "b"
                body = await resp.json()
                assert [x["index"] for x in body["results"]] == [0, 2, 1]
        assert a.backend.requests["/v1/rerank"] == 0 and a.backend.requests["/rerank"] == 0
        async with s.post(r.url + "/v1/rerank", json={**ask, "documents": []}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "documents"
    # a model only an Ollama-type backend serves: 501 in OpenAI's shape
    async with run_router({"endpoints": [{"url": a.url, "name": "a"}]}) as r2, aiohttp.ClientSession() as s:
        async with s.post(r2.url + "/v1/rerank", json=ask) as resp:
            err = (await resp.json())["error"]
            assert resp.status == 501 and err["code"] == "not_implemented" and "OpenAI-type" in err["message"]


async def test_messages_never_go_to_an_openai_type_backend(mixed, clients):
    a, b, r = mixed
    async with aiohttp.ClientSession() as s:
        ask = {"model": "rr", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(r.url + "/v1/messages", json=ask) as resp:  # rr only on b (OpenAI-type)
            body = await resp.json()
            assert resp.status == 501 and body["type"] == "error" and "Ollama backends only" in body["error"]["message"]
        for _ in range(4):  # llama3 is on both: always a, never a 501
            async with s.post(r.url + "/v1/messages", json={**ask, "model": "llama3"}) as resp:
                assert resp.headers.get("X-Router-Endpoint") == "a"


async def test_images_and_transcriptions(mixed, clients):
    a, b, r = mixed
    client = clients.openai(r.url)
    images = await client.images.generate(model="rr", prompt="a cat", n=2)
    assert len(images.data) == 2 and images.data[0].b64_json
    audio = bytes(range(256)) * 1000 + b"\r\n--not-a-boundary\r\n"  # binary, with CRLFs inside
    text = await client.audio.transcriptions.create(model="rr", file=("talk.wav", audio, "audio/wav"))
    assert text.text == f"mock transcription of {len(audio)} bytes"  # the file arrived whole and unchanged
    text = await client.audio.transcriptions.create(model="llama3", file=("talk.wav", audio, "audio/wav"))
    assert text.text.endswith(f"{len(audio)} bytes")
    assert a.backend.requests["/v1/audio/transcriptions"] + b.backend.requests["/v1/audio/transcriptions"] == 2
    async with aiohttp.ClientSession() as s:
        form = aiohttp.FormData()
        form.add_field("file", b"abc", filename="x.wav")
        async with s.post(r.url + "/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "model"
        async with s.post(r.url + "/v1/audio/transcriptions", data=b"not multipart") as resp:
            assert resp.status == 400
        async with s.post(r.url + "/v1/images/generations", json={"model": "rr"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["param"] == "prompt"


async def test_previous_response_id_goes_where_the_response_was_made(mock, mock2):
    async with run_router({"endpoints": endpoints(mock, mock2)}) as r, aiohttp.ClientSession() as s:
        made = {}
        for m in (mock, mock2):
            m.update(ttft_ms=100.0)  # overlapping requests spread over both endpoints

        async def start(n: int) -> None:
            stream = n % 2 == 1
            async with s.post(
                r.url + "/v1/responses", json={"model": "llama3", "input": f"start {n}", "stream": stream}
            ) as resp:
                text = await resp.text()
                rid = (
                    json.loads(text)["id"]
                    if not stream
                    else json.loads(text.split("data: ", 2)[1].split("\n")[0])["response"]["id"]
                )
                made[rid] = resp.headers["X-Router-Endpoint"]

        await asyncio.gather(*(start(n) for n in range(6)))
        assert len(set(made.values())) == 2
        for rid, ep in made.items():
            async with s.post(
                r.url + "/v1/responses", json={"model": "llama3", "input": "go on", "previous_response_id": rid}
            ) as resp:
                assert resp.status == 200
                assert (resp.headers["X-Router-Endpoint"], resp.headers["X-Router-Affinity"]) == (ep, "hit")
