"""Credentials in the config never leave the router except where they belong.

An endpoint url may carry `user:password@`: the router sends it as `Authorization: Basic`
on every call to that backend (discovery, probes, /api/show, generation, model management)
and never in the Host header, a log line, /metrics, /health, the dashboard's data, an error
body, or `nomyo-router --check`'s output. Real sockets: a raw HTTP backend on 127.0.0.1 that
records every request head it is sent, and the router in this event loop or as the CLI.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import yaml

from mock import free_port
from test.helpers import run_router

USER, PASSWORD = "us@er", "p:ss"  # both need percent-encoding in a url
CRED_URL = "http://us%40er:p%3Ass@127.0.0.1:{port}"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
API_KEY = "sk-backend-key-0123456789"
CLIENT_KEY, ADMIN_KEY, METRICS_KEY = "client-key-0123456789", "admin-key-0123456789", "metrics-key-0123456789"
# what must never be printed: the credentials as given, decoded, or encoded for the header
SECRETS = (
    "us%40er",
    "p%3Ass",
    USER,
    f"{USER}:{PASSWORD}",
    BASIC.split()[1],
    API_KEY,
    CLIENT_KEY,
    ADMIN_KEY,
    METRICS_KEY,
)
CHAT = {"model": "llama3", "messages": [{"role": "user", "content": "hi"}]}


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


class Backend:
    """An Ollama stand-in on a raw socket (keep-alive, Content-Length answers) that records
    each request's method, path and header lines as sent."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, list[tuple[str, str]]]] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Backend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Gone: no more connections, and the kept-alive ones are closed."""
        assert self._server is not None
        self._server.close()
        for w in self._conns:
            w.close()

    def headers(self, name: str) -> list[str]:
        """Every value of header `name` sent in any request."""
        return [v for _, _, hs in self.requests for k, v in hs if k == name]

    def paths(self) -> set[str]:
        return {path for _, path, _ in self.requests}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                line, *rest = head[:-4].split("\r\n")
                method, path, _ = line.split(" ", 2)
                hs = [(k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in rest)]
                body = await self._body(reader, dict(hs))
                self.requests.append((method, path, hs))
                ctype, payload = self._answer(method, path, json.loads(body) if body.strip() else {})
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                    % (ctype, len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()

    @staticmethod
    async def _body(reader: asyncio.StreamReader, hs: dict[str, str]) -> bytes:
        if "content-length" in hs:
            return await reader.readexactly(int(hs["content-length"]))
        if hs.get("transfer-encoding", "").lower() != "chunked":
            return b""
        out = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            out += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                return out

    @staticmethod
    def _answer(method: str, path: str, body: dict[str, Any]) -> tuple[bytes, bytes]:
        def js(obj: Any) -> tuple[bytes, bytes]:
            return b"application/json", json.dumps(obj).encode()

        def nd(*objs: Any) -> tuple[bytes, bytes]:
            return b"application/x-ndjson", b"".join(json.dumps(o).encode() + b"\n" for o in objs)

        model = {
            "name": "llama3:latest",
            "model": "llama3:latest",
            "size": 1,
            "digest": "0" * 64,
            "details": {"family": "llama"},
        }
        done = {"model": "llama3", "done": True, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 2}
        if path == "/api/version":
            return js({"version": "0.12.0"})
        if path == "/api/tags":
            return js({"models": [model]})
        if path == "/api/ps":
            return js({"models": []})
        if path == "/api/show":
            return js({"modelfile": "FROM llama3", "details": model["details"]})
        if path in ("/api/chat", "/api/generate"):
            piece = {"message": {"role": "assistant", "content": "ok"}} if path == "/api/chat" else {"response": "ok"}
            if body.get("stream", True):
                return nd({"model": "llama3", "done": False, **piece}, {**done, **piece, "response": ""})
            return js({**done, **piece})
        if path == "/api/pull":
            return nd({"status": "pulling manifest"}, {"status": "success"})
        return js({})  # /api/copy, /api/delete


async def _texts(url: str, s: aiohttp.ClientSession) -> dict[str, str]:
    """What an operator can read from the router: every status page as text."""
    out = {}
    for path in ("/health", "/metrics", "/dashboard/data"):
        async with s.get(url + path) as r:
            out[path] = await r.text()
    return out


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    async with Backend() as b:
        yield b


async def test_url_credentials_go_as_basic_auth_on_every_call_and_nowhere_else(backend, caplog):
    caplog.set_level(logging.DEBUG)
    ep = {"url": CRED_URL.format(port=backend.port), "name": "box", "type": "ollama"}
    cfg = {"endpoints": [ep], "health_interval": 0.1, "routing": "least_busy"}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for stream in (False, True):
            for path in ("/api/chat", "/api/generate"):
                async with s.post(r.url + path, json={**CHAT, "prompt": "hi", "stream": stream}) as resp:
                    assert resp.status == 200, await resp.text()
                    assert b'"done": true' in (await resp.read()).replace(b'"done":true', b'"done": true')
        async with s.post(r.url + "/api/show", json={"model": "llama3"}) as resp:
            assert resp.status == 200 and "modelfile" in await resp.json()
        async with s.post(r.url + "/api/copy", json={"source": "llama3", "destination": "llama3-copy"}) as resp:
            assert resp.status == 200, await resp.text()
        async with s.delete(r.url + "/api/delete", json={"model": "llama3"}) as resp:
            assert resp.status == 200, await resp.text()
        async with s.post(r.url + "/api/pull", json={"model": "llama3", "stream": False}) as resp:
            assert resp.status == 200, await resp.text()
        for _ in range(100):  # a few health probes after the first discovery
            if sum(p == "/api/version" for _, p, _ in backend.requests) >= 3:
                break
            await asyncio.sleep(0.05)
        pages = await _texts(r.url, s)
    assert {
        "/api/version",
        "/api/tags",
        "/api/ps",
        "/api/show",
        "/api/chat",
        "/api/generate",
        "/api/copy",
        "/api/delete",
        "/api/pull",
    } <= backend.paths()
    assert sum(p == "/api/version" for _, p, _ in backend.requests) >= 3  # detection and probes
    for method, path, hs in backend.requests:  # h1 (generation, probes) and aiohttp (management) alike
        names = [k for k, _ in hs]
        assert names.count("authorization") == 1 and names.count("host") == 1, (method, path, hs)
        assert dict(hs)["authorization"] == BASIC, (method, path)
        assert dict(hs)["host"] == f"127.0.0.1:{backend.port}", (method, path)
    assert json.loads(pages["/health"])["status"] == "ok"
    for where, text in {**pages, "log": caplog.text}.items():
        assert not leaked(text), where
    assert "box" in caplog.text  # the start-up lines name the endpoint, by name


async def test_an_api_key_is_sent_as_bearer_and_never_printed(backend, caplog):
    caplog.set_level(logging.DEBUG)
    ep = {"url": f"http://127.0.0.1:{backend.port}", "name": "box", "api_key": API_KEY}
    async with run_router({"endpoints": [ep]}) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 200
        pages = await _texts(r.url, s)
    assert set(backend.headers("authorization")) == {f"Bearer {API_KEY}"}
    for where, text in {**pages, "log": caplog.text}.items():
        assert not leaked(text), where


async def test_a_backend_that_is_down_is_named_without_its_credentials(backend, caplog):
    """It answered discovery, then went away: the failed attempts (h1 for generation, aiohttp
    for management), the ejection and the probes all say where they tried, not with what."""
    caplog.set_level(logging.DEBUG)
    ep = {"url": CRED_URL.format(port=backend.port), "name": "gone", "type": "ollama"}
    cfg = {"endpoints": [ep], "connect_timeout": 0.5, "max_attempts": 1, "health_interval": 60}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        backend.stop()
        await asyncio.sleep(0.05)
        bodies = []
        for stream in (False, True):
            async with s.post(r.url + "/api/chat", json={**CHAT, "stream": stream}) as resp:
                bodies.append(await resp.text())
                assert resp.status >= 500, bodies[-1]
        async with s.post(
            r.url + "/api/copy", json={"source": "llama3", "destination": "x"}, headers={"X-Router-Endpoints": "gone"}
        ) as resp:
            bodies.append(await resp.text())
            assert resp.status >= 500, bodies[-1]
        pages = await _texts(r.url, s)
    assert f"127.0.0.1:{backend.port}" in caplog.text + "".join(bodies) + pages["/health"]  # where it tried
    for where, text in {**pages, "log": caplog.text, **{f"body {i}": b for i, b in enumerate(bodies)}}.items():
        assert not leaked(text), where


async def test_a_backend_down_from_the_start_is_named_without_its_credentials(caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()  # nothing listens there
    ep = {"url": CRED_URL.format(port=port), "name": "dead", "type": "ollama", "models": ["llama3"]}
    async with run_router({"endpoints": [ep], "connect_timeout": 0.5}) as r, aiohttp.ClientSession() as s:
        async with s.post(r.url + "/api/chat", json={**CHAT, "stream": False}) as resp:
            assert resp.status == 503
            body = await resp.text()
        pages = await _texts(r.url, s)
    assert f"127.0.0.1:{port}" in caplog.text and f"127.0.0.1:{port}" in pages["/health"]
    for where, text in {**pages, "log": caplog.text, "body": body}.items():
        assert not leaked(text), where


async def test_credentials_in_the_url_and_an_api_key_are_refused():
    from nomyo_router.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config({"endpoints": [{"url": CRED_URL.format(port=1), "api_key": API_KEY}]})
    assert "keep one" in str(e.value) and not leaked(str(e.value))


# ---- the CLI ------------------------------------------------------------------------------


def _check(tmp_path: Any, config: dict[str, Any]) -> subprocess.CompletedProcess:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "nomyo_router", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_check_prints_no_secret(tmp_path):
    r = _check(
        tmp_path,
        {
            "endpoints": [
                {"url": CRED_URL.format(port=11434), "name": "a"},
                {"url": "http://127.0.0.1:8000/v1", "name": "b", "api_key": API_KEY},
            ],
            "router_api_key": "router-key-0123456789",
            "admin_key": ADMIN_KEY,
            "metrics_key": METRICS_KEY,
            "client_keys": [{"name": "alice", "key": CLIENT_KEY}],
        },
    )
    assert r.returncode == 0 and "ok, 2 endpoint(s)" in r.stdout, r.stderr
    assert not leaked(r.stdout + r.stderr)


@pytest.mark.parametrize(
    "url",
    [
        "http://us%40er:p%3Ass@127.0.0.1:notaport",  # a bad port
        "ftp://us%40er:p%3Ass@127.0.0.1:21",  # a bad scheme
        "http://us%40er:p%3Ass@",  # no host
    ],
)
def test_a_bad_url_is_reported_without_its_credentials(tmp_path, url):
    r = _check(tmp_path, {"endpoints": [url]})
    assert r.returncode == 2 and "endpoints[0].url" in r.stderr and "***@" in r.stderr
    assert not leaked(r.stdout + r.stderr)


@pytest.mark.parametrize(
    "extra",
    [
        {"admin_key": "abc"},  # too short
        {"client_keys": [{"name": "a", "key": ADMIN_KEY, "models": "llama3"}]},  # models not a list
        {"admin_key": ADMIN_KEY, "client_keys": [{"name": "a", "key": ADMIN_KEY}]},  # shared
    ],
)
def test_a_bad_key_setting_is_reported_without_the_key(tmp_path, extra):
    r = _check(tmp_path, {"endpoints": ["http://127.0.0.1:11434"], **extra})
    assert r.returncode == 2 and "bad config" in r.stderr
    assert not leaked(r.stdout + r.stderr) and "abc" not in r.stderr


def test_the_served_router_logs_no_credentials(tmp_path):
    """The real CLI, debug logging: start-up lines, discovery failing against a dead backend,
    a request that finds it down."""
    dead, port = free_port(), free_port()
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "endpoints": [
                    {"url": CRED_URL.format(port=dead), "name": "dead", "type": "ollama", "models": ["llama3"]}
                ],
                "usage_db": None,
                "connect_timeout": 0.5,
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "NOMYO_ROUTER_CONFIG"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nomyo_router", "--config", str(path), "--port", str(port), "--log-level", "debug"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        from mock.runner import wait_http

        wait_http(f"http://127.0.0.1:{port}/", 30, proc)
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/chat",
            data=json.dumps(CHAT).encode(),
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        body = e.value.read().decode()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "dead" in out and f"127.0.0.1:{dead}" in out + body
    assert not leaked(out + body)
