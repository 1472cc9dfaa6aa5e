"""Model management through the router against TWO real Ollama servers, driven by the real
`ollama` CLI (`cp`, `rm`, `create`, `stop`): both servers change and a new name is served at
once. Each server has its own model store, so deleting on one never touches the other.
Skipped, with the reason, where `../shared/real-backends` is absent."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import aiohttp
import pytest

from test import real_backends
from test.helpers import run_router

SHARED = real_backends.SHARED


@pytest.fixture(scope="module")
def two_ollamas() -> Iterator[list[str]]:
    real_backends.require("no real Ollama servers to manage")
    urls, pids, dirs = [], [], []
    try:
        for _ in range(2):
            dirs.append(tempfile.mkdtemp(prefix="ollama-manage-"))
            url, pid = real_backends.start("start-ollama.sh", "1", dirs[-1])
            pids.append(pid)
            urls.append(url)
        yield urls
    finally:
        for pid in pids:
            os.kill(pid, 15)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


async def _cli_run(router_url: str, *args: str, cwd: str | None = None) -> str:
    env = {**os.environ, "OLLAMA_HOST": router_url.removeprefix("http://"), "HOME": tempfile.gettempdir()}
    cli = await asyncio.to_thread(real_backends.ollama_cli)  # (may unpack it: ~2 s off the loop)
    proc = await asyncio.create_subprocess_exec(
        str(cli), *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"ollama {' '.join(args)} failed: {text[-800:]}"
    return text


async def _tags(url: str) -> set[str]:
    async with aiohttp.ClientSession() as s, s.get(url + "/api/tags") as r:
        return {m["name"] for m in (await r.json())["models"]}


async def test_cli_cp_rm_create_change_both_servers(two_ollamas, tmp_path):
    a, b = two_ollamas
    cfg = {
        "endpoints": [{"url": a, "name": "a"}, {"url": b, "name": "b"}],
        "model_refresh_interval": 3600,
    }  # only the router's own refresh can make new names known
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        await _cli_run(r.url, "cp", "tiny", "tiny-copy")
        assert "tiny-copy:latest" in await _tags(a) and "tiny-copy:latest" in await _tags(b)
        ask = {"model": "tiny-copy", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        async with s.post(r.url + "/api/generate", json=ask) as resp:
            assert resp.status == 200, await resp.text()  # served at once, no 404
        # (not `ollama run`: the random-weight model may generate until the context is full)
        out = await _cli_run(r.url, "show", "tiny-copy")
        assert "llama" in out.lower()

        await _cli_run(r.url, "rm", "tiny-copy")
        assert "tiny-copy:latest" not in await _tags(a) and "tiny-copy:latest" not in await _tags(b)
        async with s.post(r.url + "/api/generate", json=ask) as resp:
            assert resp.status == 404

        # a blob neither server has: uploaded once to each through the router, then created on both
        shutil.copy(SHARED / "real-backends" / "tiny-embed.gguf", tmp_path / "weights.gguf")
        (tmp_path / "Modelfile").write_text("FROM ./weights.gguf\n")
        out = await _cli_run(r.url, "create", "made-here", "-f", "Modelfile", cwd=str(tmp_path))
        assert "success" in out
        assert "made-here:latest" in await _tags(a) and "made-here:latest" in await _tags(b)
        async with s.post(r.url + "/api/show", json={"model": "made-here"}) as resp:
            assert resp.status == 200
        names = {m["name"] for m in (await (await s.get(r.url + "/api/tags")).json())["models"]}
        assert "made-here:latest" in names

        # only one of them, by header
        async with s.post(
            r.url + "/api/copy", json={"source": "tiny", "destination": "only-b"}, headers={"X-Router-Endpoints": "b"}
        ) as resp:
            assert resp.status == 200
        assert "only-b:latest" in await _tags(b) and "only-b:latest" not in await _tags(a)
        async with s.delete(r.url + "/api/delete", json={"model": "only-b"}) as resp:
            assert resp.status == 200
        assert "only-b:latest" not in await _tags(b)
        # a copy of a model that does not exist: Ollama's 404, through the CLI's error path
        async with s.post(r.url + "/api/copy", json={"source": "nope", "destination": "x"}) as resp:
            assert resp.status == 404


async def test_open_webui_calls_through_the_router(two_ollamas):
    """What Open WebUI sends to an Ollama connection, against two real servers: version,
    tags, ps, show, chat (stream), embed, pull (no registry here: the error names both
    endpoints), delete of a copy (gone from both), unload (keep_alive 0: unloaded on both)."""
    a, b = two_ollamas
    cfg = {"endpoints": [{"url": a, "name": "a"}, {"url": b, "name": "b"}]}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for path in ("/api/version", "/api/tags", "/api/ps"):
            async with s.get(r.url + path) as resp:
                assert resp.status == 200, path
        async with s.post(r.url + "/api/show", json={"model": "tiny"}) as resp:
            assert resp.status == 200 and "template" in await resp.json()
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}}
        async with s.post(r.url + "/api/chat", json=chat) as resp:
            lines = [json.loads(x) for x in (await resp.read()).splitlines() if x.strip()]
            assert resp.status == 200 and lines[-1]["done"] is True
        async with s.post(r.url + "/api/embed", json={"model": "tiny", "input": ["a", "b"]}) as resp:
            direct = await (await s.post(a + "/api/embed", json={"model": "tiny", "input": ["a", "b"]})).json()
            assert resp.status == 200 and len((await resp.json())["embeddings"]) == len(direct["embeddings"]) == 2
        async with s.post(r.url + "/api/pull", json={"model": "no-registry-here", "stream": True}) as resp:
            lines = [json.loads(x) for x in (await resp.read()).splitlines() if x.strip()]
            err = lines[-1].get("error", "") if lines else (await resp.json())["error"]
            assert "a (" in err and "b (" in err and not any(x.get("status") == "success" for x in lines)
        async with s.post(r.url + "/api/copy", json={"source": "tiny", "destination": "webui-copy"}) as resp:
            assert resp.status == 200
        async with s.delete(r.url + "/api/delete", json={"name": "webui-copy"}) as resp:  # Open WebUI sends name
            assert resp.status == 200
        assert "webui-copy:latest" not in await _tags(a) and "webui-copy:latest" not in await _tags(b)
        for ep in (a, b):  # load it on both, then one unload through the router
            await (
                await s.post(
                    ep + "/api/generate",
                    json={"model": "tiny", "prompt": "x", "options": {"num_predict": 1}, "stream": False},
                )
            ).read()
        async with s.post(r.url + "/api/generate", json={"model": "tiny", "keep_alive": 0}) as resp:
            assert resp.status == 200
        for ep in (a, b):
            for _ in range(300):  # the runner stops asynchronously (slowly on a loaded machine)
                ps = await (await s.get(ep + "/api/ps")).json()
                if not ps["models"]:
                    break
                await asyncio.sleep(0.1)
            assert ps["models"] == [], ep
