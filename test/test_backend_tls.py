"""TLS on either side. An https backend: the upstream client speaks TLS (asyncio's `ssl`, the
system's trust store: here SSL_CERT_FILE names a self-signed certificate), streams and whole
answers come through unchanged. An https router: streams reach the client whole. Either
way a stream stays on the Python relay — the compiled one (relay/pump.py) reads and writes
sockets, which over TLS carry ciphertext."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.relay import pump as native
from test.helpers import run_router

CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def taken(monkeypatch):
    used = {"native": 0}
    relay = native.relay

    async def counting(*args, **kwargs):
        out = await relay(*args, **kwargs)
        used["native"] += out is not None
        return out

    monkeypatch.setattr(native, "relay", counting)
    return used


@pytest.fixture
def cert(tmp_path, monkeypatch):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    key, crt = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(crt),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(crt))  # read when a pool makes its SSL context
    return key, crt


@asynccontextmanager
async def tls_front(port: int, key, crt) -> AsyncIterator[int]:
    """A TLS terminator on a free port of 127.0.0.1, in front of 127.0.0.1:`port`."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            w.close()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        br, bw = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(r, bw), pipe(br, w))

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_streams_and_whole_answers_over_tls_and_the_stream_stays_on_the_python_relay(cert, taken):
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=60) as m,
        tls_front(int(m.url.rsplit(":", 1)[1]), *cert) as port,
    ):
        eps = [{"url": f"https://127.0.0.1:{port}", "name": "tls", "max_concurrent": 4}]
        async with run_router({"endpoints": eps}) as r, aiohttp.ClientSession() as s:
            async with s.post(m.url + "/api/chat", json=CHAT) as resp:
                direct = [json.loads(x) for x in (await resp.read()).splitlines()]
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
                routed = [json.loads(x) for x in (await resp.read()).splitlines()]
            async with s.post(r.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
                assert resp.status == 200
                whole = await resp.json()
    text = lambda lines: "".join(x["message"]["content"] for x in lines)  # noqa: E731
    assert text(routed) == text(direct) and len(routed) == 61 and routed[-1]["done"] is True
    assert whole["message"]["content"] == text(direct) and whole["eval_count"] == 60
    assert taken["native"] == 0  # ciphertext on the socket: never the compiled relay


async def test_an_https_router_streams_whole_and_keeps_the_python_relay(cert, taken):
    key, crt = cert
    async with (
        run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=60) as m,
        run_router({"endpoints": [{"url": m.url, "name": "m0", "max_concurrent": 4}]}, tls=(str(key), str(crt))) as r,
    ):
        assert r.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(crt))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
                lines = [json.loads(x) for x in (await resp.read()).splitlines()]
    assert len(lines) == 61 and lines[-1]["done"] is True and lines[-1]["eval_count"] == 60
    assert taken["native"] == 0
