"""The moe- ensemble on real sockets: samples fanned out to distinct endpoints at once (or
shared when too few serve the model), a review and a final answer built from them, one answer
in the client's API shape streamed or not, read by the official clients; 404 in the API's
shape, a limited key's models, a capped key's permits, and no caching."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from mock import run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}]


def spy(m: Any, path: str, seen: list[tuple[str, dict[str, Any]]], name: str) -> None:
    """Record (mock name, body) of every request `m` gets on `path`."""
    route = m.backend.routes[("POST", path)]

    async def spying(request: Any) -> Any:
        seen.append((name, json.loads(await request.read())))
        return await route(request)

    m.backend.routes[("POST", path)] = spying


def step(body: dict[str, Any]) -> str:
    text = json.dumps(body)
    return (
        "review" if "Several assistants answered" in text else "final" if "best possible answer" in text else "sample"
    )


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_samples_go_to_distinct_endpoints_then_a_review_and_the_final_answer(path, stream):
    seen: list[tuple[str, dict[str, Any]]] = []
    async with (
        run_mock(ttft_ms=150, tok_ms=0, tokens=8) as a,
        run_mock(ttft_ms=150, tok_ms=0, tokens=8) as b,
        run_mock(ttft_ms=150, tok_ms=0, tokens=8) as c,
    ):
        for name, m in (("a", a), ("b", b), ("c", c)):
            spy(m, path, seen, name)
        # (whole answers asked whole: the bodies the backends see are the ensemble's own)
        async with run_router({"endpoints": endpoints(a, b, c), "stream_whole_answers": False}) as r:
            async with aiohttp.ClientSession() as s:
                body = {"model": "moe-llama3", "messages": MSGS, "stream": stream, "seed": 7}
                t0 = asyncio.get_running_loop().time()
                async with s.post(r.url + path, json=body, headers={"X-Session-ID": "conv-1"}) as resp:
                    data = await resp.read()
                    took = asyncio.get_running_loop().time() - t0
    assert resp.status == 200 and resp.headers["X-Router-Moe"] == "3"
    steps = [(name, step(b), b) for name, b in seen]
    samples = [(name, b) for name, kind, b in steps if kind == "sample"]
    assert sorted(name for name, _ in samples) == ["a", "b", "c"]  # one per endpoint, whatever the affinity
    assert all(b["messages"] == MSGS and b["stream"] is False and "seed" not in b for _, b in samples)
    assert [kind for _, kind, _ in steps] == ["sample"] * 3 + ["review", "final"]
    assert took < 0.15 * 3 + 0.5  # the samples were asked at once, not one after another
    review, final = steps[3][2], steps[4][2]
    assert review["messages"][0] == MSGS[0] and review["stream"] is False
    assert final["messages"][0] == MSGS[0] and final["stream"] is stream
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit"
    assert final["messages"][-1]["content"].count(words) == 3 + 1  # the three answers and the review
    assert "Why is the sky blue?" in final["messages"][-1]["content"]
    if path == "/api/chat":
        records = [json.loads(x) for x in data.splitlines() if x.strip()]
        assert records[-1]["done"] is True
        assert "".join(x["message"]["content"] for x in records).strip() == words
    elif stream:
        assert data.rstrip().endswith(b"data: [DONE]")
    else:
        assert json.loads(data)["choices"][0]["message"]["content"].strip() == words


async def test_with_fewer_endpoints_than_samples_one_serves_several_and_clients_read_it(clients):
    seen: list[tuple[str, dict[str, Any]]] = []
    async with run_mock(**FAST) as a:
        spy(a, "/v1/chat/completions", seen, "a")
        spy(a, "/api/generate", seen, "a")
        async with run_router({"endpoints": endpoints(a), "moe": {"samples": 2}}) as r:
            oa = clients.openai(r.url)
            parts = [
                ch async for ch in await oa.chat.completions.create(model="moe-llama3", messages=MSGS, stream=True)
            ]
            text = "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices)
            gen = await clients.ollama(r.url).generate(model="moe-llama3", prompt="Why?", stream=False)
    assert text.strip() and gen.response.strip() and gen.done
    assert [step(b) for _, b in seen] == ["sample", "sample", "review", "final"] * 2


async def test_nobody_serving_the_model_is_a_404_in_the_api_s_shape(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        async with aiohttp.ClientSession() as s:
            async with s.post(r.url + "/v1/chat/completions", json={"model": "moe-nosuch", "messages": MSGS}) as resp:
                assert resp.status == 404
                assert (await resp.json())["error"]["code"] == "model_not_found"
            async with s.post(r.url + "/api/chat", json={"model": "moe-nosuch", "messages": MSGS}) as resp:
                assert resp.status == 404 and (await resp.json()) == {"error": "model 'nosuch' not found"}
    assert mock.stats()["requests_total"] == 0


async def test_keys_limits_and_the_cache_apply_to_the_model_behind_the_prefix(mock):
    keys = [
        {"name": "tiny", "key": "tiny-key-123", "models": ["llama3"], "max_concurrent": 1},
        {"name": "other", "key": "other-key-12", "models": ["qwen2.5:7b"]},
    ]
    async with run_router({"endpoints": endpoints(mock), "client_keys": keys, "cache": {"enabled": True}}) as r:
        async with aiohttp.ClientSession() as s:
            body = {"model": "moe-llama3", "messages": MSGS, "stream": False, "nomyo": {"cache": True}}
            async with s.post(r.url + "/api/chat", json=body, headers={"Authorization": "Bearer other-key-12"}) as resp:
                assert resp.status == 403
            tiny = {"Authorization": "Bearer tiny-key-123"}
            got = []
            for _ in range(2):  # a key capped at one request at a time still gets its ensemble, twice
                async with s.post(r.url + "/api/chat", json=body, headers=tiny) as resp:
                    got.append((resp.status, resp.headers.get("X-Router-Response-Cache")))
    assert got == [(200, "bypass"), (200, "bypass")]  # never cached
    assert mock.stats()["requests"]["/api/chat"] == 10
    assert mock.stats()["max_in_flight"] == 1  # each step waited for the key's one permit


async def test_an_ensemble_s_samples_and_review_count_on_the_key_s_rpm(mock):
    keys = [{"name": "k", "key": "k-key-123456", "rpm": 3}]
    config = {"endpoints": endpoints(mock), "client_keys": keys, "moe": {"samples": 3}}
    async with run_router(config) as r, aiohttp.ClientSession() as s:
        body = {"model": "moe-llama3", "messages": MSGS, "stream": False}
        headers = {"Authorization": "Bearer k-key-123456"}
        async with s.post(r.url + "/api/chat", json=body, headers=headers) as resp:
            assert resp.status == 200
            used = resp.headers["X-Router-Moe"]
        async with s.post(r.url + "/api/chat", json=body, headers=headers) as resp:
            assert resp.status == 429  # the minute's three requests were spent by the first ensemble
    # the request and two samples are its three: the third sample and the review were refused
    assert used == "2" and mock.stats()["requests"]["/api/chat"] == 3


async def test_failed_samples_are_left_out(mock2):
    async with run_mock(**FAST) as a:
        async with run_router({"endpoints": endpoints(a, mock2)}) as r:
            mock2.update(fail_rate=1.0)
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    r.url + "/api/chat", json={"model": "moe-llama3", "messages": MSGS, "stream": False}
                ) as resp:
                    assert resp.status == 200
                    used = int(resp.headers["X-Router-Moe"])
    assert used == 2  # a and a again; mock2's sample failed
