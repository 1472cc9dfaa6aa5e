"""Model management fanned out to two mocks through the router, with the official ollama client."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import ollama
import pytest

from mock import free_port, run_mock
from test import real_backends
from test.helpers import endpoints, run_router

FAST = dict(ttft_ms=0.0, tok_ms=0.0, tokens=4, models=["llama3"])


async def _models(mock) -> list[str]:
    async with aiohttp.ClientSession() as s, s.get(mock.url + "/api/tags") as r:
        return [m["name"] for m in (await r.json())["models"]]


@pytest.fixture
async def two():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r:
            yield a, b, r


async def test_pull_merges_progress_and_the_model_is_served_at_once(two, clients):
    a, b, r = two
    client = clients.ollama(r.url)
    parts = [p async for p in await client.pull("newmodel", stream=True)]
    progress = [p for p in parts if p.digest]
    assert progress and {p.total for p in progress} == {2 * 4096}  # one layer, two endpoints
    assert progress[-1].completed == 2 * 4096
    assert [p.completed for p in progress] == sorted(p.completed for p in progress)
    statuses = [p.status for p in parts if not p.digest]
    assert "m0: pulling manifest" in statuses and "m1: pulling manifest" in statuses
    assert parts[-1].status == "success" and statuses.count("success") == 1
    assert "newmodel:latest" in await _models(a) and "newmodel:latest" in await _models(b)
    answer = await client.chat(model="newmodel", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert answer.message.content
    assert not (await client.pull("newmodel", stream=False)).status != "success"


async def test_copy_and_delete_change_both_and_are_served_at_once(two, clients):
    a, b, r = two
    client = clients.ollama(r.url)
    await client.copy("llama3", "llama3-copy")
    assert "llama3-copy:latest" in await _models(a) and "llama3-copy:latest" in await _models(b)
    out = await client.generate(model="llama3-copy", prompt="hi", stream=False)
    assert out.response
    names = {m.model for m in (await client.list()).models}
    assert "llama3-copy:latest" in names
    await client.delete("llama3-copy")
    assert "llama3-copy:latest" not in await _models(a) and "llama3-copy:latest" not in await _models(b)
    with pytest.raises(ollama.ResponseError) as e:
        await client.generate(model="llama3-copy", prompt="hi", stream=False)
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        await client.delete("never-there")
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as e:
        await client.copy("never-there", "x")
    assert e.value.status_code == 404


async def test_create_from_an_uploaded_blob_on_both(two, clients, tmp_path):
    a, b, r = two
    client = clients.ollama(r.url)
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4000)  # ~1 MB, more than one body piece
    digest = await client.create_blob(path)
    assert digest in a.backend.manage.blobs and digest in b.backend.manage.blobs
    parts = [p async for p in await client.create("made", files={"weights.gguf": digest}, stream=True)]
    assert parts[-1].status == "success"
    assert "made:latest" in await _models(a) and "made:latest" in await _models(b)
    done = await client.create("made2", from_="llama3")  # non-stream
    assert done.status == "success" and "made2:latest" in await _models(b)


async def test_blob_upload_is_streamed_past_max_body_bytes_and_checked():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        cfg = {"endpoints": endpoints(a, b), "max_body_bytes": 64 * 1024}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            data = bytes(range(256)) * 8192  # 2 MiB, 32x max_body_bytes
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            async with s.head(f"{r.url}/api/blobs/{digest}") as resp:
                assert resp.status == 404
            async with s.post(f"{r.url}/api/blobs/{digest}", data=data) as resp:
                assert resp.status == 201, await resp.text()
            async with s.head(f"{r.url}/api/blobs/{digest}") as resp:
                assert resp.status == 200
            assert a.backend.requests["/api/blobs"] >= 2 and digest in b.backend.manage.blobs
            wrong = "sha256:" + "0" * 64
            async with s.post(f"{r.url}/api/blobs/{wrong}", data=b"abc") as resp:
                assert resp.status == 400
                err = (await resp.json())["error"]
                assert "m0" in err and "m1" in err and "digest mismatch" in err
            async with s.post(f"{r.url}/api/blobs/sha256:xyz", data=b"abc") as resp:
                assert resp.status == 400 and "invalid digest" in (await resp.json())["error"]
            # JSON bodies are still bounded
            async with s.post(f"{r.url}/api/pull", data=b'{"model":"' + b"x" * 70000 + b'"}') as resp:
                assert resp.status == 413


async def test_header_restricts_the_endpoints(two, clients):
    a, b, r = two
    only = ollama.AsyncClient(host=r.url, headers={"X-Router-Endpoints": "m1"})
    try:
        parts = [p async for p in await only.pull("solo", stream=True)]
        assert parts[-1].status == "success"
        assert {p.total for p in parts if p.digest} == {4096}
        assert "solo:latest" in await _models(b) and "solo:latest" not in await _models(a)
    finally:
        await only.close()
    bad = ollama.AsyncClient(host=r.url, headers={"X-Router-Endpoints": "m1,nope"})
    try:
        with pytest.raises(ollama.ResponseError) as e:
            await bad.pull("solo")
        assert e.value.status_code == 400 and "nope" in e.value.error
    finally:
        await bad.close()


async def test_a_failed_endpoint_is_named_and_there_is_no_success(clients):
    async with run_mock(**FAST) as a:
        dead = {"url": f"http://127.0.0.1:{free_port()}", "name": "dead", "type": "ollama"}
        async with run_router({"endpoints": [*endpoints(a), dead]}) as r:
            client = clients.ollama(r.url)
            with pytest.raises(ollama.ResponseError) as e:
                [p async for p in await client.pull("newmodel", stream=True)]
            assert "dead (unreachable)" in e.value.error and "succeeded on m0" in e.value.error
            with pytest.raises(ollama.ResponseError) as e:
                await client.pull("other", stream=False)
            assert e.value.status_code == 502 and "dead" in e.value.error
            with pytest.raises(ollama.ResponseError) as e:  # every endpoint fails: the registry's error
                [p async for p in await client.pull("missing-model", stream=True)]
            assert "file does not exist" in e.value.error and "m0" in e.value.error
            async with aiohttp.ClientSession() as s:
                async with s.post(r.url + "/api/pull", data=b"[1]") as resp:
                    assert resp.status == 400 and "error" in await resp.json()
                async with s.post(r.url + "/api/copy", json={"source": "llama3"}) as resp:
                    assert resp.status == 400 and "destination" in (await resp.json())["error"]


async def test_management_takes_no_generation_slot():
    async with run_mock(**{**FAST, "tokens": 4000, "tok_ms": 5.0}) as a:  # a 20 s stream holds the slot
        async with run_router({"endpoints": endpoints(a, slots=1)}) as r, aiohttp.ClientSession() as s:
            body = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            async with s.post(r.url + "/api/chat", json=body) as gen:
                await gen.content.readline()  # the only slot is taken
                async with s.post(r.url + "/api/copy", json={"source": "llama3", "destination": "c2"}) as resp:
                    assert resp.status == 200
                async with s.get(r.url + "/health") as h:
                    assert (await h.json())["endpoints"][0]["in_flight"] == 1
                assert not gen.content.at_eof()
            assert "c2:latest" in await _models(a)


async def test_management_needs_the_admin_key_when_one_is_set(mock):
    admin, user = "admin-key-0123456789", "user-key-0123456789"
    cfg = {"endpoints": endpoints(mock), "router_api_key": user, "admin_key": admin}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        body = {"source": "llama3", "destination": "kept"}
        async with s.post(r.url + "/api/copy", json=body, headers={"Authorization": f"Bearer {user}"}) as resp:
            assert resp.status == 403 and "admin key" in (await resp.json())["error"]
        async with s.post(r.url + "/api/copy", json=body) as resp:
            assert resp.status == 401
        async with s.post(r.url + "/api/copy", json=body, headers={"Authorization": f"Bearer {admin}"}) as resp:
            assert resp.status == 200
        assert "kept:latest" in await _models(mock)
    limited = {"endpoints": endpoints(mock), "client_keys": [{"name": "app", "key": user, "models": ["llama3"]}]}
    async with run_router(limited) as r, aiohttp.ClientSession() as s:
        async with s.delete(
            r.url + "/api/delete", json={"model": "kept"}, headers={"Authorization": f"Bearer {user}"}
        ) as resp:
            assert resp.status == 403 and "limited" in (await resp.json())["error"]
        assert "kept:latest" in await _models(mock)


async def test_the_real_ollama_cli_reads_the_merged_pull_stream(two):
    """`ollama pull` (the real CLI) through the router over two mocks: it draws the merged
    progress and exits 0 only on the final success; a failure on one endpoint is its error."""
    import os

    a, b, r = two
    cli = await asyncio.to_thread(real_backends.ollama_cli)  # (may unpack it: ~2 s off the loop)
    env = {**os.environ, "OLLAMA_HOST": r.url.removeprefix("http://"), "HOME": "/tmp"}

    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            str(cli), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode(errors="replace")

    code, out = await run("pull", "clipulled")
    assert code == 0 and "success" in out and "m0: pulling manifest" in out, out[-500:]
    assert "clipulled:latest" in await _models(a) and "clipulled:latest" in await _models(b)
    code, out = await run("pull", "missing-thing")
    assert code != 0 and "m0 (pull model manifest: file does not exist)" in out, out[-500:]
    code, out = await run("rm", "clipulled")
    assert code == 0 and "clipulled:latest" not in await _models(b), out[-500:]
