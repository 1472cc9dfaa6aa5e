"""Client keys and browser origins, through the official clients."""

from __future__ import annotations

import hashlib

import aiohttp
import anthropic
import ollama
import openai
import pytest

from test.helpers import endpoints, run_router

KEY = "router-key-0123456789"
LIMITED = "limited-key-0123456789"
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def config(mock) -> dict:
    return {
        "endpoints": endpoints(mock),
        "router_api_key": KEY,
        "client_keys": [
            {
                "name": "team-b",
                "key": "sha256:" + hashlib.sha256(LIMITED.encode()).hexdigest(),
                "models": ["qwen2.5:7b"],
            }
        ],
    }


@pytest.mark.parametrize(
    "path,shape",
    [
        ("/api/chat", "ollama"),
        ("/api/tags", "ollama"),
        ("/api/show", "ollama"),
        ("/v1/chat/completions", "openai"),
        ("/v1/models", "openai"),
        ("/v1/messages", "anthropic"),
    ],
)
async def test_no_or_wrong_key_is_401_in_the_callers_shape(mock, path, shape):
    async with run_router(config(mock)) as r, aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Bearer wrong-key-0000000"}, {"x-api-key": "nope"}):
            method = s.get if path in ("/api/tags", "/v1/models") else s.post
            async with method(r.url + path, json=CHAT, headers=headers) as resp:
                body = await resp.json()
                assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
                if shape == "ollama":
                    assert isinstance(body["error"], str)
                elif shape == "openai":
                    assert body["error"]["type"] == "authentication_error"
                else:
                    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"


async def test_the_right_key_works_with_the_official_clients(mock, clients):
    async with run_router(config(mock)) as r:
        oa = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key=KEY, max_retries=0)
        out = await oa.chat.completions.create(model="llama3", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content
        await oa.close()
        with pytest.raises(openai.AuthenticationError):
            bad = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="wrong-key-00000", max_retries=0)
            try:
                await bad.models.list()
            finally:
                await bad.close()
        ol = ollama.AsyncClient(host=r.url, headers={"Authorization": f"Bearer {KEY}"})
        resp = await ol.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
        assert resp.message.content
        with pytest.raises(ollama.ResponseError) as e:
            await ollama.AsyncClient(host=r.url).list()
        assert e.value.status_code == 401
        an = anthropic.AsyncAnthropic(base_url=r.url, api_key="wrong-key-00000", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await an.messages.create(model="llama3", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        await an.close()


async def test_a_key_limited_to_some_models_gets_403_for_others(mock):
    async with run_router(config(mock)) as r, aiohttp.ClientSession() as s:
        h = {"Authorization": f"Bearer {LIMITED}"}
        async with s.post(r.url + "/api/chat", json=CHAT, headers=h) as resp:
            assert resp.status == 403
        async with s.post(r.url + "/api/chat", json={**CHAT, "model": "qwen2.5:7b"}, headers=h) as resp:
            assert resp.status == 200


async def test_health_is_open_but_shows_details_only_to_an_operator_key(mock):
    admin = "admin-key-0123456789"
    async with run_router({**config(mock), "admin_key": admin}) as r, aiohttp.ClientSession() as s:
        for headers in ({}, {"x-api-key": KEY}, {"Authorization": f"Bearer {LIMITED}"}):
            async with s.get(r.url + "/health", headers=headers) as resp:
                assert resp.status == 200 and await resp.json() == {"status": "ok"}
        async with s.get(r.url + "/health", headers={"Authorization": f"Bearer {admin}"}) as resp:
            body = await resp.json()
            assert "usage" in body and body["endpoints"][0]["models"]


async def test_browser_origins_like_ollama(mock):
    async with (
        run_router({"endpoints": endpoints(mock), "allowed_origins": ["https://*.example.org"]}) as r,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(r.url + "/api/chat", json=CHAT, headers={"Origin": "http://evil.example"}) as resp:
            assert resp.status == 403
        # a text/plain "simple" cross-origin POST is refused too (no preflight protects it)
        async with s.post(
            r.url + "/api/chat",
            data=b'{"model":"llama3"}',
            headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
        ) as resp:
            assert resp.status == 403
        for origin in (
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "app://obsidian.md",
            "https://chat.example.org",
        ):
            async with s.post(r.url + "/api/chat", json=CHAT, headers={"Origin": origin}) as resp:
                assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == origin
        async with s.options(
            r.url + "/v1/chat/completions",
            headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"},
        ) as resp:
            assert resp.status == 204
            assert "authorization" in resp.headers["Access-Control-Allow-Headers"]


async def test_a_capped_key_cannot_starve_another_client():
    import asyncio
    import time

    from mock import run_mock

    async with run_mock(ttft_ms=200, tok_ms=0, tokens=2) as m:
        cfg = {
            "endpoints": endpoints(m, slots=2),
            "client_keys": [
                {"name": "flood", "key": "flood-key-0123456789", "max_concurrent": 1},
                {"name": "other", "key": "other-key-0123456789"},
            ],
            "metrics_key": "metrics-key-0123456789",
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:

            async def ask(key: str) -> float:
                async with s.post(r.url + "/api/chat", json=CHAT, headers={"x-api-key": key}) as resp:
                    assert resp.status == 200
                    await resp.read()
                return time.monotonic()

            t0 = time.monotonic()
            flood = [asyncio.create_task(ask("flood-key-0123456789")) for _ in range(6)]
            await asyncio.sleep(0.05)
            other_done = await ask("other-key-0123456789") - t0
            flood_done = sorted(await asyncio.gather(*flood))
            assert other_done < 0.45  # one service time: not behind the 5 waiting flood requests
            assert flood_done[-1] - t0 > 1.1  # the flood ran one at a time (6 x 200 ms)
            async with s.get(r.url + "/health", headers={"x-api-key": "metrics-key-0123456789"}) as h:
                assert all(e["in_flight"] == 0 for e in (await h.json())["endpoints"])
