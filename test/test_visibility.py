"""What a key may see and hold: its own models only, operator data only with an operator key,
a bounded share of the queue, and metric labels that requests cannot invent."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from mock import run_mock
from test.helpers import endpoints, run_router

ADMIN, METRICS = "admin-key-0123456789", "metrics-key-0123456789"
LIMITED, FULL = "limited-key-0123456789", "full-key-0123456789"
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def config(mock, **extra) -> dict:
    return {
        "endpoints": endpoints(mock),
        "admin_key": ADMIN,
        "metrics_key": METRICS,
        "client_keys": [{"name": "limited", "key": LIMITED, "models": ["qwen2.5:7b"]}, {"name": "full", "key": FULL}],
        **extra,
    }


async def test_a_limited_key_lists_and_shows_only_its_models(mock):
    async with run_router(config(mock)) as r, aiohttp.ClientSession() as s:
        for key, expect in ((LIMITED, ["qwen2.5:7b"]), (FULL, ["llama3:latest", "qwen2.5:7b"])):
            async with s.get(r.url + "/api/tags", headers=bearer(key)) as resp:
                assert resp.status == 200
                assert sorted(m["model"] for m in (await resp.json())["models"]) == expect
            async with s.get(r.url + "/v1/models", headers=bearer(key)) as resp:
                ids = sorted(m["id"] if ":" in m["id"] else m["id"] + ":latest" for m in (await resp.json())["data"])
                assert ids == expect
        async with s.get(r.url + "/api/ps", headers=bearer(LIMITED)) as resp:
            assert resp.status == 200
            assert [m["model"] for m in (await resp.json())["models"]] == ["qwen2.5:7b"]  # (both are loaded)
        async with s.get(r.url + "/v1/models/llama3", headers=bearer(LIMITED)) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"
        async with s.get(r.url + "/v1/models/llama3", headers=bearer(FULL)) as resp:
            assert resp.status == 200
        async with s.get(r.url + "/v1/models/qwen2.5:7b", headers=bearer(LIMITED)) as resp:
            assert resp.status == 200
        # /api/show of another model: exactly as if it were absent (no modelfile, template, parameters)
        async with s.post(r.url + "/api/show", json={"model": "llama3"}, headers=bearer(LIMITED)) as resp:
            hidden = (resp.status, await resp.json())
        async with s.post(r.url + "/api/show", json={"model": "nope"}, headers=bearer(LIMITED)) as resp:
            absent = (resp.status, await resp.json())
        assert hidden[0] == absent[0] == 404 and "modelfile" not in hidden[1]
        assert hidden[1]["error"].replace("llama3", "nope") == absent[1]["error"]
        async with s.post(r.url + "/api/show", json={"model": "qwen2.5:7b"}, headers=bearer(LIMITED)) as resp:
            assert resp.status == 200


@pytest.mark.parametrize("path", ["/metrics", "/dashboard/data"])
async def test_operator_data_need_an_operator_key(mock, path):
    async with run_router(config(mock)) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + path) as resp:
            assert resp.status == 401
        for key in (LIMITED, FULL):
            async with s.get(r.url + path, headers=bearer(key)) as resp:
                assert resp.status == 403
        for key in (ADMIN, METRICS):
            async with s.get(r.url + path, headers=bearer(key)) as resp:
                assert resp.status == 200, key


async def test_the_metrics_key_reads_and_nothing_else(mock):
    async with run_router(config(mock)) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/api/chat", json=CHAT, headers=bearer(METRICS)) as resp:
            assert resp.status == 403 and "metrics key" in (await resp.json())["error"]
        async with s.get(r.url + "/api/tags", headers=bearer(METRICS)) as resp:
            assert resp.status == 403
        async with s.get(r.url + "/health", headers=bearer(METRICS)) as resp:
            assert "endpoints" in await resp.json()
        async with s.get(r.url + "/dashboard") as resp:  # the page is static (its data need the key)
            assert resp.status == 200 and b"dashboard/data" in await resp.read()


async def test_metrics_without_keys_stay_open(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + "/metrics") as resp:
            assert resp.status == 200


async def test_unknown_models_never_become_labels(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r, aiohttp.ClientSession() as s:
        for i in range(50):
            async with s.post(r.url + "/api/chat", json={**CHAT, "model": f"made-up-{i}"}) as resp:
                assert resp.status == 404  # still a 404 to the client
        async with s.post(r.url + "/api/chat", json=CHAT) as resp:
            assert resp.status == 200
        async with s.get(r.url + "/metrics") as resp:
            text = await resp.text()
    assert "made-up" not in text
    assert 'model="(unknown)"' in text and 'model="llama3"' in text
    requests = [line for line in text.splitlines() if line.startswith("nomyo_router_requests_total{")]
    assert len(requests) == 2  # one series for every unknown model, one for llama3


async def test_a_capped_keys_waiting_requests_count_toward_max_queue():
    """A key held to 1 request at a time, with a queue of 3: its further requests wait up to
    the queue's size; beyond, each is refused at once (503 + Retry-After), nothing buffered."""
    async with run_mock(ttft_ms=400, tok_ms=0, tokens=2) as m:
        cfg = {
            "endpoints": endpoints(m, slots=4),
            "max_queue": 3,
            "client_keys": [
                {"name": "flood", "key": "flood-key-0123456789", "max_concurrent": 1},
                {"name": "other", "key": "other-key-0123456789"},
            ],
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:

            async def ask(key: str) -> tuple[int, str | None, float]:
                t = asyncio.get_running_loop().time()
                async with s.post(r.url + "/api/chat", json=CHAT, headers={"x-api-key": key}) as resp:
                    await resp.read()
                    return resp.status, resp.headers.get("Retry-After"), asyncio.get_running_loop().time() - t

            flood = [asyncio.create_task(ask("flood-key-0123456789")) for _ in range(12)]
            await asyncio.sleep(0.2)
            assert r.router.store.held_aside == 3  # 1 running, 3 held aside, the rest refused
            other = await ask("other-key-0123456789")  # another key still gets a slot at once
            results = await asyncio.gather(*flood)
            assert other[0] == 200 and other[2] < 0.7
            served = [x for x in results if x[0] == 200]
            refused = [x for x in results if x[0] == 503]
            assert len(served) == 4 and len(refused) == 8
            assert all(x[1] == "1" and x[2] < 0.3 for x in refused)  # at once, with Retry-After
            assert r.router.store.held_aside == 0 and not r.router.client_limits._waiting
