"""Against a real Ollama (`../shared/real-backends`, v0.24, a tiny random-weight model): the
same calls direct and through the router. Skipped, with the reason, where it is absent."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from test import real_backends
from test.helpers import run_router

KEY = "router-key-0123456789"


@pytest.fixture(scope="module")
def ollama_url() -> Iterator[str]:
    yield from real_backends.ollama_server("no real Ollama to compare with")


async def test_anthropic_messages_through_the_router_with_a_key(ollama_url):
    cfg = {"endpoints": [{"url": ollama_url, "name": "real"}], "router_api_key": KEY}
    async with run_router(cfg) as r:
        direct = anthropic.AsyncAnthropic(base_url=ollama_url, api_key="unused", max_retries=0)
        routed = anthropic.AsyncAnthropic(base_url=r.url, api_key=KEY, max_retries=0)
        try:
            ask = dict(
                model="tiny",
                max_tokens=8,
                extra_body={"temperature": 0},  # the same tokens both ways
                messages=[{"role": "user", "content": "hi"}],
            )
            a, b = await direct.messages.create(**ask), await routed.messages.create(**ask)
            assert (a.type, a.role, a.model, a.stop_reason) == (b.type, b.role, b.model, b.stop_reason)
            assert b.content and b.usage.output_tokens == a.usage.output_tokens
            async with routed.messages.stream(**ask) as stream:
                events = [e.type async for e in stream]
            assert events[0] == "message_start" and events[-1] == "message_stop"
            with pytest.raises(anthropic.AuthenticationError):
                bad = anthropic.AsyncAnthropic(base_url=r.url, api_key="wrong-key-00000", max_retries=0)
                try:
                    await bad.messages.create(**ask)
                finally:
                    await bad.close()
            with pytest.raises(anthropic.NotFoundError):
                await routed.messages.create(**{**ask, "model": "no-such-model"})
        finally:
            await direct.close()
            await routed.close()


async def test_newer_routes_direct_and_through_the_router(ollama_url):
    """/v1/responses (stream and not), /api/status and /v1/models/{id}: the same answers; rerank,
    which Ollama does not serve, is a 501 in OpenAI's shape instead of Ollama's 404."""
    import aiohttp
    import openai

    async with run_router({"endpoints": [{"url": ollama_url, "name": "real"}]}) as r:
        direct = openai.AsyncOpenAI(base_url=ollama_url + "/v1", api_key="unused", max_retries=0)
        routed = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
        try:
            ask = dict(model="tiny", input="hi", max_output_tokens=4, temperature=0)  # the same tokens both ways
            a, b = await direct.responses.create(**ask), await routed.responses.create(**ask)
            assert (a.object, a.model, a.status, [o.type for o in a.output]) == (
                b.object,
                b.model,
                b.status,
                [o.type for o in b.output],
            )
            assert b.usage.output_tokens == a.usage.output_tokens
            kinds_a = [e.type async for e in await direct.responses.create(**ask, stream=True)]
            kinds_b = [e.type async for e in await routed.responses.create(**ask, stream=True)]
            assert kinds_a[0] == kinds_b[0] == "response.created" and kinds_a[-1] == kinds_b[-1]
            assert set(kinds_a) == set(kinds_b)
            with pytest.raises(openai.NotFoundError):
                await routed.responses.create(**{**ask, "model": "no-such-model"})
        finally:
            await direct.close()
            await routed.close()
        async with aiohttp.ClientSession() as s:
            async with s.get(ollama_url + "/api/status") as d, s.get(r.url + "/api/status") as via:
                assert via.status == d.status == 200 and await via.json() == await d.json()
            async with s.post(r.url + "/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["a"]}) as resp:
                assert resp.status == 501 and (await resp.json())["error"]["code"] == "not_implemented"


@pytest.mark.alone  # the router's learned pace of a real CPU model: other tests' work would slow it 4x
async def test_a_long_whole_answer_after_short_ones_is_answered_once(ollama_url):
    """Short whole answers teach the router they take a few milliseconds; a whole answer of 300
    tokens after them is answered whole, by one backend call, and nothing is ejected (it used
    to be cut as hung at the learned deadline and retried)."""
    import ollama

    cfg = {"endpoints": [{"url": ollama_url, "name": "real"}], "first_byte_floor": 0.5, "stream_idle_timeout": 5.0}
    async with run_router(cfg) as r:
        done: list = []
        r.router.events.on_request_done(done.append)
        happened: list[str] = []
        r.router.events.on_count(lambda what, endpoint, model: happened.append(what))
        client = ollama.AsyncClient(host=r.url)
        msgs = [{"role": "user", "content": "hi"}]
        for _ in range(3):
            short = await client.chat(model="tiny", messages=msgs, options={"temperature": 0, "num_predict": 4})
            assert short.eval_count == 4
        long = await client.chat(model="tiny", messages=msgs, options={"temperature": 0, "num_predict": 300})
        assert long.done and long.eval_count == 300 and long.done_reason == "length"
        assert long.message.role == "assistant" and long.message.content
        assert [(d.status, d.retries, d.resumed) for d in done] == [(200, 0, 0)] * 4
        assert done[-1].completion_tokens == 300 and done[-1].tokens_from == "backend"
        assert "retry" not in happened and "ejection" not in happened
        assert r.router.health.snapshot()["real"]["consecutive_failures"] == 0
