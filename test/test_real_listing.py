"""The real `ollama` CLI and ollama-python listing models through a router in front of a real
Ollama and a real OpenAI-only server (llama-cpp-python, `../shared/real-backends`): `ollama
list`, `ps` and `show` work, and every model has a 64-hex digest, an OpenAI-type endpoint's
derived from the endpoint and the model, the same on every listing and every router.
Skipped, with the reason, where the real backends are absent."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator

import aiohttp
import pytest

from test import real_backends
from test.helpers import run_router

HEX64 = re.compile(r"[0-9a-f]{64}")
OPENAI_MODELS = {"tiny-oa", "tiny-oa-tools", "tiny-oa-embed"}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[str, str]]:
    real_backends.require("no real Ollama and OpenAI-only server to list")
    ollama = real_backends.ollama_server("no real Ollama to list", parallel=1)
    ollama_url = next(ollama)
    try:
        url, pid = real_backends.start("start-llamacpp.sh", timeout=600)
        try:
            yield ollama_url, url
        finally:
            os.kill(pid, 15)
    finally:
        ollama.close()


def cli(router_url: str, *args: str) -> str:
    env = {**os.environ, "OLLAMA_HOST": router_url.removeprefix("http://"), "HOME": tempfile.gettempdir()}
    out = subprocess.run([str(real_backends.ollama_cli()), *args], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ollama {' '.join(args)} failed: {(out.stdout + out.stderr)[-800:]}"
    return out.stdout


def table(text: str) -> dict[str, str]:
    """NAME -> ID of `ollama list` / `ollama ps`."""
    lines = text.strip().splitlines()
    assert lines[0].split()[:2] == ["NAME", "ID"], lines[0]
    return {line.split()[0]: line.split()[1] for line in lines[1:]}


async def tags(url: str) -> dict[str, str]:
    async with aiohttp.ClientSession() as s, s.get(url + "/api/tags") as r:
        assert r.status == 200
        return {m["name"]: m["digest"] for m in (await r.json())["models"]}


async def test_ollama_list_ps_and_show_through_mixed_endpoints(backends, clients):
    ollama_url, openai_url = backends
    config = {"endpoints": [{"url": ollama_url, "name": "ol"}, {"url": openai_url, "name": "oa", "type": "openai"}]}
    async with run_router(config) as r:
        digests = await tags(r.url)
        assert OPENAI_MODELS | {"tiny:latest", "tiny2:latest"} <= set(digests)
        assert all(HEX64.fullmatch(d) for d in digests.values()), digests
        assert len({digests[m] for m in OPENAI_MODELS}) == len(OPENAI_MODELS)  # one per model
        assert digests["tiny:latest"] == (await tags(ollama_url))["tiny:latest"]  # Ollama's own, as it is

        listed = table(await asyncio.to_thread(cli, r.url, "list"))
        assert {name: digests[name][:12] for name in listed} == listed

        async with aiohttp.ClientSession() as s:  # load tiny, so that `ps` has a row
            ask = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
            async with s.post(r.url + "/api/generate", json=ask) as resp:
                assert resp.status == 200
        running = table(await asyncio.to_thread(cli, r.url, "ps"))
        assert running == {"tiny:latest": digests["tiny:latest"][:12]}
        assert "llama" in await asyncio.to_thread(cli, r.url, "show", "tiny")
        assert "completion" in await asyncio.to_thread(cli, r.url, "show", "tiny-oa")

        client = clients.ollama(r.url)  # ollama-python reads the same
        models = {m.model: m for m in (await client.list()).models}
        assert {name: m.digest for name, m in models.items()} == digests
        assert models["tiny-oa"].details is not None and models["tiny-oa"].size == 0
        assert [m.model for m in (await client.ps()).models] == ["tiny:latest"]
        assert "completion" in ((await client.show("tiny-oa")).capabilities or [])

    async with run_router(config) as again:  # another router (or a restart): the same digests
        assert await tags(again.url) == digests
