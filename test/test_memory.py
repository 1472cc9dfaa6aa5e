"""What a worker loads (idle RSS): a real `nomyo-router` worker, after serving every
kind of call but model management, has not loaded aiohttp (~10 MB of a worker's memory) nor
the load tester's numpy; a model-management call loads aiohttp when it first needs it.
Checked from the outside, in the worker's memory map (their compiled modules)."""

from __future__ import annotations

import aiohttp

from mock import run_mock
from test.helpers import endpoints
from test.router_proc import ready, router_workers

FAST = dict(ttft_ms=0.0, tok_ms=0.0, tokens=4, models=["llama3"])


def mapped(pid: int, package: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return f"/site-packages/{package}/" in f.read()


async def test_a_worker_loads_aiohttp_only_for_model_management():
    async with run_mock(**FAST) as m:
        with router_workers({"endpoints": endpoints(m)}, 1, wait=False) as (url, proc):
            await ready(url)
            chat = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession() as s:
                for path, body in (
                    ("/api/chat", {**chat, "stream": False}),
                    ("/api/chat", chat),
                    ("/v1/chat/completions", chat),
                    ("/api/show", {"model": "llama3"}),
                    ("/api/generate", {"model": "llama3", "keep_alive": 0}),
                ):
                    async with s.post(url + path, json=body) as r:
                        assert r.status == 200, (path, await r.text())
                        await r.read()
                for path in ("/api/tags", "/api/ps", "/api/status", "/v1/models", "/health", "/metrics"):
                    async with s.get(url + path) as r:
                        assert r.status == 200, path
                # the worker (with one worker, the process itself) relayed them to the mock
                assert m.backend.requests["/api/chat"] == 2 and m.backend.requests["/api/generate"] == 1
                assert not mapped(proc.pid, "aiohttp") and not mapped(proc.pid, "numpy")
                async with s.post(url + "/api/copy", json={"source": "llama3", "destination": "llama3-b"}) as r:
                    assert r.status == 200, await r.text()
                assert mapped(proc.pid, "aiohttp")
