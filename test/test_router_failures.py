"""Failover, health, and bad input."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from mock import MockConfig, MockProcess, free_port, run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def test_sigkill_one_of_two_backends_mid_load_loses_nothing():
    cfg = MockConfig(ttft_ms=20.0, tok_ms=2.0, tokens=20, parallel=64)
    with MockProcess(cfg) as a, MockProcess(cfg) as b:
        router_cfg = {"endpoints": endpoints(a, b, slots=16), "health_interval": 0.5}
        async with run_router(router_cfg) as r, aiohttp.ClientSession() as s:

            async def worker(n: int) -> list[int]:
                out = []
                for _ in range(n):
                    async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                        await resp.read()
                        out.append(resp.status)
                return out

            load = [asyncio.create_task(worker(15)) for _ in range(16)]
            await asyncio.sleep(0.3)
            b.kill()
            statuses = [st for t in await asyncio.gather(*load) for st in t]
            assert statuses == [200] * 240
            assert not r.router.store.is_healthy(r.router.endpoints[1])


async def test_backend_answering_503_is_routed_around():
    async with run_mock(**FAST) as good, run_mock(**FAST, busy_rate=1.0) as busy:
        async with run_router({"endpoints": endpoints(good, busy)}) as r, aiohttp.ClientSession() as s:
            for i in range(20):  # distinct prompts: no cached prefix keeps them all on m0
                body = {**CHAT, "messages": [{"role": "user", "content": f"hi {i}"}]}
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "m0"
            assert busy.stats()["errors_injected"].get("busy", 0) >= 1


async def test_only_backend_busy_passes_its_503_through():
    async with run_mock(**FAST, busy_rate=1.0) as busy:
        async with run_router({"endpoints": endpoints(busy)}) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 503
                assert "server busy" in (await resp.json())["error"]


async def test_health_is_truthful_and_an_endpoint_comes_back():
    port = free_port()
    async with run_mock(**FAST) as alive:
        dead_url = f"http://127.0.0.1:{port}"
        cfg = {
            "endpoints": [{"url": alive.url, "name": "alive"}, {"url": dead_url, "name": "dead"}],
            "health_interval": 0.1,
            "connect_timeout": 0.5,
        }
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            async with s.get(r.url + "/health") as h:
                body = await h.json()
                assert h.status == 200
                assert {e["name"]: e["healthy"] for e in body["endpoints"]} == {"alive": True, "dead": False}
            assert "http://" not in json.dumps(body)  # names only, never URLs
            await alive.close()
            await asyncio.sleep(0.4)
            async with s.get(r.url + "/health") as h:
                assert h.status == 503
            from mock import start_mock

            back = await start_mock(alive.backend.config, port=port)  # a backend appears on "dead"
            try:
                await asyncio.sleep(0.4)
                async with s.get(r.url + "/health") as h:
                    body = await h.json()
                    assert h.status == 200 and body["endpoints"][1]["healthy"] is True
                async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                    assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "dead"
            finally:
                await back.close()


BAD_INPUTS = [
    # (method, path, body, status, expected message fragment)
    ("POST", "/api/chat", b"{not json", 400, "invalid JSON"),
    ("POST", "/api/chat", b"[1, 2]", 400, "JSON object"),
    ("POST", "/api/chat", b'{"messages": []}', 400, "model is required"),
    ("POST", "/api/chat", b'{"model": ""}', 400, "model is required"),
    ("POST", "/api/chat", b'{"model": 3}', 400, "model must be a string"),
    ("POST", "/api/chat", b'{"model": "llama3", "messages": "hi"}', 400, "messages must be a list"),
    ("POST", "/api/chat", b'{"model": "llama3", "stream": "yes"}', 400, "stream must be a boolean"),
    ("POST", "/api/generate", b'{"model": "llama3", "options": []}', 400, "options must be an object"),
    ("POST", "/api/generate", b'{"model": "llama3", "prompt": 5}', 400, "prompt must be a string"),
    ("POST", "/api/chat", b'{"model": "nope"}', 404, "not found"),
    ("GET", "/api/chat", b"", 405, "not allowed"),
    ("POST", "/api/nothing", b"{}", 404, "no route"),
    ("POST", "/api/chat", b'{"model": "llama3", "x": "' + b"a" * 2048 + b'"}', 413, "exceeds"),
    ("POST", "/v1/chat/completions", b"{not json", 400, "invalid JSON"),
    ("POST", "/v1/chat/completions", b'{"model": "llama3"}', 400, "messages is required"),
    ("POST", "/v1/chat/completions", b'{"model": "llama3", "messages": []}', 400, "must not be empty"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user"}]}', 400, "model is required"),
    ("POST", "/v1/chat/completions", b'{"model": "llama3", "messages": [1]}', 400, "messages[0]"),
    (
        "POST",
        "/v1/chat/completions",
        b'{"model": "llama3", "messages": [{"role": "user"}], "max_tokens": "x"}',
        400,
        "max_tokens",
    ),
    ("POST", "/v1/completions", b'{"model": "llama3"}', 400, "prompt is required"),
    ("POST", "/v1/embeddings", b'{"model": "llama3", "input": {"a": 1}}', 400, "input must be"),
    ("POST", "/v1/chat/completions", b'{"model": "gone", "messages": [{"role": "user"}]}', 404, "does not exist"),
    ("GET", "/v1/chat/completions", b"", 405, "not allowed"),
    ("GET", "/v1/nothing", b"", 404, "no route"),
    ("POST", "/v1/embeddings", b'{"model": "llama3", "input": "' + b"a" * 2048 + b'"}', 413, "exceeds"),
]


@pytest.mark.parametrize("method,path,body,status,fragment", BAD_INPUTS)
async def test_bad_input_gets_a_4xx_in_the_api_shape(method, path, body, status, fragment):
    async with run_mock(**FAST) as m:
        async with run_router({"endpoints": endpoints(m), "max_body_bytes": 1024}) as r, aiohttp.ClientSession() as s:
            async with s.request(method, r.url + path, data=body) as resp:
                assert resp.status == status
                err = (await resp.json())["error"]
            if path.startswith("/v1/"):
                assert set(err) == {"message", "type", "param", "code"}
                assert fragment in err["message"]
            else:
                assert isinstance(err, str) and fragment in err
            # nothing leaked: the router still serves, with no slot held
            async with s.post(r.url + "/api/chat", json=CHAT) as ok:
                assert ok.status == 200
            assert r.router.store.in_flight(r.router.endpoints[0]) == 0


async def test_a_failed_model_refresh_keeps_serving_the_stale_list():
    async with run_mock(**FAST, models=["llama3", "only-here"]) as m:
        cfg = {"endpoints": endpoints(m), "model_refresh_interval": 0.1, "health_interval": 60}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            await m.close()  # the backend disappears: refreshes now fail
            await asyncio.sleep(0.4)
            async with s.get(r.url + "/api/tags") as t:
                names = {x["name"] for x in (await t.json())["models"]}
            assert names == {"llama3:latest", "only-here:latest"}


def test_uvicorn_entry_point_reads_the_config_from_the_environment(tmp_path):
    import os
    import subprocess
    import sys

    from mock.runner import wait_http

    with MockProcess(MockConfig(ttft_ms=0.0, tok_ms=0.0, tokens=2)) as m:
        cfg = tmp_path / "config.yaml"
        cfg.write_text(f"endpoints:\n  - url: {m.url}\n    name: via-uvicorn\n")
        port = free_port()
        env = {**os.environ, "NOMYO_ROUTER_CONFIG": str(cfg)}
        p = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "nomyo_router.app:app", "--port", str(port), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health", 20, p)
            import urllib.request

            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/chat", method="POST", data=json.dumps({**CHAT}).encode()
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.headers["X-Router-Endpoint"] == "via-uvicorn"
                assert json.loads(resp.read())["done"] is True
        finally:
            p.terminate()
            p.wait(10)


@pytest.mark.parametrize("path,shape", [("/api/chat", "ollama"), ("/v1/chat/completions", "openai")])
async def test_backend_errors_pass_through_with_status_and_body(path, shape):
    async with run_mock(**FAST, fail_rate=1.0) as m:
        async with run_router({"endpoints": endpoints(m)}) as r, aiohttp.ClientSession() as s:
            async with s.post(r.url + path, json=CHAT) as resp:
                assert resp.status == 500
                err = (await resp.json())["error"]
    assert (err if shape == "ollama" else err["message"]) == "injected failure"
    assert m.stats()["errors_injected"] == {"fail": 1}  # a 500 is not retried
