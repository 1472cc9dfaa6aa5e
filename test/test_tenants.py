"""Tenants are separate, on real sockets: with client keys, the routing headers that tell where
other keys' conversations and prompts went are sent only to operators and keys with
`debug_headers`, and conversation pins are per key (a key continuing another key's
conversation, or reusing its session id, learns nothing), while one key's own conversation
still follows its pin."""

from __future__ import annotations

from typing import Any

import aiohttp

from mock import run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

ROUTING = ("X-Router-Endpoint", "X-Router-Affinity", "X-Router-Cache")
KEYS = [
    {"name": "alice", "key": "alice-key-123", "debug_headers": True},
    {"name": "carol", "key": "carol-key-123", "debug_headers": True},
    {"name": "bob", "key": "bob-key-12345"},
]
SECRET = [{"role": "user", "content": "My salary is 2450 a month. " + "x" * 2000}]
TURN2 = [*SECRET, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And per year?"}]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def chat(s: aiohttp.ClientSession, url: str, key: str, messages: list[Any], **headers: str) -> dict[str, str]:
    body = {"model": "llama3", "messages": messages, "stream": False}
    async with s.post(url + "/api/chat", json=body, headers={**bearer(key), **headers}) as resp:
        assert resp.status == 200, await resp.text()
        return {h: resp.headers[h] for h in ROUTING if h in resp.headers}


async def test_routing_headers_only_for_operators_and_debug_keys_and_pins_are_per_key():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        config = {"endpoints": endpoints(a, b), "client_keys": KEYS, "admin_key": "admin-key-1234"}
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            plain = await chat(s, r.url, "bob-key-12345", SECRET)
            assert plain == {}  # a tenant's key: none of them
            first = await chat(s, r.url, "alice-key-123", SECRET)
            assert set(first) == set(ROUTING)  # debug_headers: all of them
            # another key continuing alice's conversation finds no pin of hers
            assert (await chat(s, r.url, "carol-key-123", TURN2))["X-Router-Affinity"] != "hit"
            # ... nor does a key that sees nothing (and it is told nothing)
            assert await chat(s, r.url, "bob-key-12345", TURN2) == {}
            # her own continuation follows her pin, as without keys
            own = await chat(s, r.url, "alice-key-123", TURN2)
            assert own["X-Router-Affinity"] == "hit" and own["X-Router-Endpoint"] == first["X-Router-Endpoint"]
            # a session id is the key's own too
            sid = {"X-Session-ID": "user-1"}
            pinned = await chat(s, r.url, "alice-key-123", [{"role": "user", "content": "hi"}], **sid)
            again = await chat(s, r.url, "alice-key-123", [{"role": "user", "content": "hi again"}], **sid)
            assert again["X-Router-Affinity"] == "hit" and again["X-Router-Endpoint"] == pinned["X-Router-Endpoint"]
            other = await chat(s, r.url, "carol-key-123", [{"role": "user", "content": "hi again"}], **sid)
            assert other["X-Router-Affinity"] != "hit"
            # the admin key sees them
            assert set(await chat(s, r.url, "admin-key-1234", SECRET)) == set(ROUTING)


async def test_an_ensemble_s_answer_carries_no_routing_header_for_a_tenant():
    async with run_mock(**FAST) as a:
        config = {"endpoints": endpoints(a), "client_keys": KEYS, "moe": {"samples": 1}}
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            body = {"model": "moe-llama3", "messages": SECRET, "stream": False}
            async with s.post(r.url + "/api/chat", json=body, headers=bearer("bob-key-12345")) as resp:
                assert resp.status == 200 and resp.headers["X-Router-Moe"] == "1"
                assert not any(h in resp.headers for h in ROUTING)


async def test_without_client_keys_everything_is_as_before():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r, aiohttp.ClientSession() as s:
            body = {"model": "llama3", "messages": SECRET, "stream": False}
            async with s.post(r.url + "/api/chat", json=body) as resp:
                first = resp.headers["X-Router-Endpoint"]
                assert "X-Router-Cache" in resp.headers
            body["messages"] = TURN2
            async with s.post(r.url + "/api/chat", json=body) as resp:
                assert resp.headers["X-Router-Affinity"] == "hit" and resp.headers["X-Router-Endpoint"] == first
