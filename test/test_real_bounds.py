"""Against a real Ollama (`../shared/real-backends`, v0.24, model `tiny`), where its parsing is
what made these attacks work: a body Ollama accepts but the router's ensemble could not read
is refused at the door (400, not the 500 it was), and a chat Ollama refuses for overflowing
its context (`truncate: false`) is asked again at most `max_attempts` times, each re-ask
counted on the client key's rpm. One Ollama per module, one token per generation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from test import real_backends
from test.helpers import run_router

KEY = "bounded-key-0123456789"
PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module")
def ollama_url() -> Iterator[str]:
    yield from real_backends.ollama_server("no real Ollama to bound")


def config(url: str, **extra: Any) -> dict[str, Any]:
    return {"endpoints": [{"url": url, "name": "ollama", "max_concurrent": 2}], **extra}


async def test_a_part_ollama_accepts_but_nobody_can_read_is_a_400_at_the_door(ollama_url):
    async with aiohttp.ClientSession() as s, run_router(config(ollama_url)) as r:
        for text in (5, None, {"a": 1}):
            msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {**PART, "text": text}]}]
            body = {"model": "tiny", "messages": msgs, "max_tokens": 1}
            async with s.post(ollama_url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200  # Ollama itself takes it (the part's `text` is ignored)
            async with s.post(r.url + "/v1/chat/completions", json={**body, "model": "moe-tiny"}) as resp:
                error = (await resp.json())["error"]
                assert resp.status == 400 and error["param"] == "messages[0].content[1].text", error


async def test_ollama_s_overflow_is_asked_again_at_most_max_attempts_times_on_the_key_s_rpm(ollama_url):
    turn = "word " * 40
    msgs: list[dict[str, Any]] = []
    for i in range(24):
        msgs += [{"role": "user", "content": f"{i} {turn}"}, {"role": "assistant", "content": turn}]
    msgs.append({"role": "user", "content": "hi"})
    body = {"model": "tiny", "messages": msgs, "stream": False, "truncate": False}
    body["options"] = {"num_ctx": 256, "num_predict": 1}
    keys = [{"name": "k", "key": KEY, "rpm": 2}]
    async with aiohttp.ClientSession() as s:
        async with s.post(ollama_url + "/api/chat", json=body) as resp:  # Ollama refuses it, without numbers
            assert resp.status == 400 and "context length" in (await resp.text())
        async with run_router(config(ollama_url, context_overflow="trim")) as r:
            async with s.post(r.url + "/api/chat", json=body) as resp:
                assert resp.status == 200, await resp.text()
                trimmed = int(resp.headers["X-Router-Trimmed"])
                async with s.get(r.url + "/metrics") as m:
                    metrics = await m.text()
        # three asks at most (max_attempts): the last with every droppable turn gone
        assert trimmed == len(msgs) - 1
        assert 'nomyo_router_events_total{endpoint="ollama",what="context_trim"} 2.0' in metrics
        async with run_router(config(ollama_url, context_overflow="trim", client_keys=keys)) as r:
            async with s.post(r.url + "/api/chat", json=body, headers={"Authorization": f"Bearer {KEY}"}) as resp:
                assert resp.status == 429  # the request and one re-ask were the key's two of the minute
