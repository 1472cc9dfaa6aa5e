"""Context-length-aware routing: two mock endpoints with different context windows (learned
from /api/show, /api/ps and /v1/models, or configured), and the real Ollama's `tiny` (2048)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.config import CONFIG_ENV, load_config
from nomyo_router.routing.context_windows import _show_window, output_tokens, prompt_tokens
from test import real_backends
from test.conftest import FAST
from test.helpers import run_router
from test.test_reload import write

WORDS = "lorem ipsum dolor sit amet " * 40  # 1080 characters: 270 estimated tokens


def chat(tokens: int, **extra: Any) -> dict[str, Any]:
    """A chat request of about `tokens` estimated prompt tokens."""
    text = (WORDS * (tokens // 270 + 1))[: tokens * 4]
    return {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": text}], **extra}


def two(small: Any, big: Any, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"url": small.url, "name": "small", "max_concurrent": 4, **extra},
        {"url": big.url, "name": "big", "max_concurrent": 4},
    ]


async def served_by(
    s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, str | None, Any]:
    async with s.post(url + path, json=body, headers=headers or {}) as resp:
        return resp.status, resp.headers.get("X-Router-Endpoint"), await resp.json()


def test_the_estimate():
    assert prompt_tokens({"model": "a-long-model-name", "messages": [{"role": "user", "content": "x" * 400}]}) == 101
    image = {"role": "user", "content": "look", "images": ["A" * 100_000]}
    assert prompt_tokens({"messages": [image]}) == 2  # "user" + "look": images are not text
    parts = {
        "role": "user",
        "content": [
            {"type": "text", "text": "y" * 40},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    assert prompt_tokens({"messages": [parts]}) == 15  # role and part types count too: it errs long
    assert output_tokens("openai", {"max_tokens": 300}) == 300
    assert output_tokens("openai", {"max_completion_tokens": 50, "max_tokens": 300}) == 50
    assert output_tokens("ollama", {"options": {"num_predict": 128}}) == 128
    assert output_tokens("ollama", {"options": {"num_predict": -1}, "max_tokens": 9}) == 0
    assert output_tokens("anthropic", {"max_tokens": 64}) == 64
    assert _show_window({"parameters": "stop x\nnum_ctx 2048", "model_info": {"llama.context_length": 8192}}) == 2048
    assert _show_window({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}}) == 32768
    assert _show_window({}) is None


async def test_a_long_request_goes_where_it_fits_before_affinity_and_load():
    async with run_mock(**FAST, context_length=1000) as small, run_mock(**FAST, context_length=8000) as big:
        async with (
            run_router({"endpoints": two(small, big), "routing": "least_busy"}) as r,
            aiohttp.ClientSession() as s,
        ):
            await r.router.windows.learn()
            ws = r.router.windows
            ep_a, ep_b = r.router.endpoints[0], r.router.endpoints[1]
            assert (ws.window(ep_a, "llama3:latest"), ws.window(ep_b, "llama3:latest")) == (1000, 8000)
            # short ones go to both (load); a pinned conversation stays on the small one
            seen = {
                (
                    await served_by(
                        s, r.url, "/api/chat", chat(50, messages=[{"role": "user", "content": f"short {i}"}])
                    )
                )[1]
                for i in range(8)
            }
            assert seen == {"small", "big"}
            sid = {"X-Session-ID": "conv-7"}
            first = None
            for _ in range(10):  # a session whose pin is the small endpoint
                status, ep, _ = await served_by(s, r.url, "/api/chat", chat(50), {"X-Session-ID": f"c{_}"})
                if ep == "small":
                    sid, first = {"X-Session-ID": f"c{_}"}, ep
                    break
            assert first == "small"
            for _ in range(4):  # 2000 tokens: only the big one fits, pin or no pin
                status, ep, _ = await served_by(s, r.url, "/api/chat", chat(2000), sid)
                assert (status, ep) == (200, "big")
            # 600 prompt tokens fit 1000; with 600 more asked for the answer they do not
            status, ep, _ = await served_by(s, r.url, "/v1/chat/completions", chat(600, max_tokens=600))
            assert (status, ep) == (200, "big")
            # route: when none fits it is sent as today (the backend decides)
            status, ep, _ = await served_by(s, r.url, "/api/chat", chat(9000))
            assert status == 200
        assert small.stats()["requests"].get("/v1/chat/completions", 0) == 0


async def test_reject_answers_400_in_the_callers_shape_naming_the_limit():
    async with run_mock(**FAST, context_length=1000) as small, run_mock(**FAST, context_length=8000) as big:
        cfg = {"endpoints": two(small, big), "context_routing": "reject"}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            await r.router.windows.learn()
            status, ep, body = await served_by(s, r.url, "/v1/chat/completions", chat(7000, max_tokens=2000))
            assert status == 400
            err = body["error"]
            assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
            assert "maximum context length is 8000 tokens" in err["message"]
            assert "2000 in the completion" in err["message"]
            status, _, body = await served_by(s, r.url, "/api/chat", chat(9000))
            assert status == 400 and list(body) == ["error"] and "8000" in body["error"]
            status, ep, _ = await served_by(s, r.url, "/api/chat", chat(3000))
            assert (status, ep) == (200, "big")
        assert small.stats()["requests_total"] == 0 and big.stats()["requests_total"] == 1


async def test_a_configured_window_overrides_the_learned_one_and_vllm_is_learned():
    async with run_mock(**FAST, context_length=1000) as small, run_mock(**FAST, context_length=8000) as big:
        eps = two(small, big)
        eps[1]["context_length"] = 500  # the operator knows better: big runs with a short window
        eps[0]["type"] = "openai"  # learned from /v1/models' max_model_len, as vLLM reports it
        async with run_router({"endpoints": eps}) as r, aiohttp.ClientSession() as s:
            await r.router.windows.learn()
            status, ep, _ = await served_by(s, r.url, "/v1/chat/completions", chat(800))
            assert (status, ep) == (200, "small")


async def test_windows_are_known_when_serving_starts_and_when_a_reload_returns(tmp_path, monkeypatch):
    """No waiting for a timer: the start learns them with discovery before it serves, and a
    reload learns those of the endpoints it adds before they take traffic."""
    async with run_mock(**FAST, context_length=2048) as small, run_mock(**FAST, context_length=32768) as big:
        path = str(tmp_path / "c.yaml")
        base = {"admin_key": "admin-key-123456", "usage_db": None, "routing": "least_busy"}
        write(path, {**base, "endpoints": two(small, big)})
        monkeypatch.setenv(CONFIG_ENV, path)
        async with run_router(load_config(path)) as r, aiohttp.ClientSession() as s:
            ws = r.router.windows  # (nothing awaited since the start)
            assert [ws.window(ep, "llama3:latest") for ep in r.router.endpoints] == [2048, 32768]
            assert [(await served_by(s, r.url, "/api/chat", chat(8000)))[1] for _ in range(4)] == ["big"] * 4
            write(path, {**base, "endpoints": [{**two(small, big)[0], "name": "small2"}, two(small, big)[1]]})
            async with s.post(r.url + "/admin/reload", headers={"Authorization": "Bearer admin-key-123456"}) as resp:
                assert resp.status == 200 and (await resp.json())["added"] == ["small2"]
            assert [ws.window(ep, "llama3:latest") for ep in r.router.endpoints] == [2048, 32768]
            assert [(await served_by(s, r.url, "/api/chat", chat(8000)))[1] for _ in range(4)] == ["big"] * 4
        assert small.stats()["requests"].get("/api/chat", 0) == 0


async def test_off_routes_as_before():
    async with run_mock(**FAST, context_length=1000) as small, run_mock(**FAST, context_length=8000) as big:
        cfg = {"endpoints": two(small, big), "context_routing": "off", "routing": "least_busy"}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            assert r.router.windows is None
            seen = {
                (
                    await served_by(
                        s, r.url, "/api/chat", chat(2000, messages=[{"role": "user", "content": f"{i} " + WORDS * 8}])
                    )
                )[1]
                for i in range(10)
            }
            assert "small" in seen


@pytest.fixture(scope="module")
def ollama_url():
    yield from real_backends.ollama_server("no real Ollama for context routing")


async def test_the_real_ollamas_window_is_learned_and_enforced(ollama_url):
    async with run_mock(**FAST, context_length=32768, models=["tiny"]) as roomy:
        eps = [{"url": ollama_url, "name": "real"}, {"url": roomy.url, "name": "roomy"}]
        async with run_router({"endpoints": eps, "context_routing": "reject"}) as r, aiohttp.ClientSession() as s:
            await r.router.windows.learn()
            real = next(ep for ep in r.router.endpoints if ep.name == "real")
            assert r.router.windows.window(real, "tiny:latest") == 2048  # the Modelfile's num_ctx, from /api/show
            long = {
                "model": "tiny",
                "stream": False,
                "options": {"num_predict": 4},
                "messages": [{"role": "user", "content": WORDS * 10}],
            }  # 2700 tokens
            for _ in range(3):
                status, ep, _ = await served_by(s, r.url, "/api/chat", long)
                assert (status, ep) == (200, "roomy")
        async with run_router({"endpoints": eps[:1], "context_routing": "reject"}) as r, aiohttp.ClientSession() as s:
            await r.router.windows.learn()
            status, _, body = await served_by(s, r.url, "/api/chat", long)
            assert status == 400 and "maximum context length is 2048 tokens" in body["error"]
            status, _, body = await served_by(s, r.url, "/v1/chat/completions", {**long, "max_tokens": 4})
            assert status == 400 and body["error"]["code"] == "context_length_exceeded"
            short = {**long, "messages": [{"role": "user", "content": "hi"}]}
            status, ep, _ = await served_by(s, r.url, "/api/chat", short)
            assert (status, ep) == (200, "real")
            await r.router.discovery.fresh_ps(max_age=0.0)
            await r.router.windows.learn()
            assert r.router.windows.window(r.router.endpoints[0], "tiny:latest") == 2048  # the loaded num_ctx
