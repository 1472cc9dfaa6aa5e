"""The door's hard edges, on real sockets in front of the mock: a request head is bounded
however it arrives (431), a body has a total deadline (408, everything freed), the bodies
held by queued requests have a byte budget (503 queue_full), every route that reaches a
backend follows the key's model list and rpm (a refusal never spends rpm), and an open
router answers only the Host names a local client uses (421 otherwise)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from mock import run_mock
from test.helpers import endpoints, read_response, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
DIGEST = "sha256:" + "ab" * 32


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: localhost\r\n%bContent-Type: application/json\r\n" % (path.encode(), extra)
    return head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


async def _health(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with s.get(url + "/health") as h:
        body: dict[str, Any] = await h.json()
        return body


# ---- the head ---------------------------------------------------------------------------
async def test_a_head_over_the_limit_gets_431_however_it_arrives(mock):
    body = json.dumps(CHAT).encode()
    big = b"X-Big: " + b"a" * 8000 + b"\r\n"  # twice max_header_bytes, sent in one write
    async with run_router({"endpoints": endpoints(mock), "max_header_bytes": 4096}) as r:
        reader, writer = await _open(r.url)
        writer.write(_post("/api/chat", body, big))
        status, _, _ = await read_response(reader)
        assert status.startswith(b"HTTP/1.1 431")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and closed
        writer.close()

        # on a kept-alive connection: a small request, then a large head in one write
        reader, writer = await _open(r.url)
        writer.write(_post("/api/chat", body))
        assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        writer.write(_post("/api/chat", body, big))
        assert (await read_response(reader))[0].startswith(b"HTTP/1.1 431")
        writer.close()

        # a large body in the same write as a small head is not a large head, first or kept-alive
        padded = json.dumps({**CHAT, "options": {"pad": "p" * 100_000}}).encode()
        reader, writer = await _open(r.url)
        for _ in range(2):
            writer.write(_post("/api/chat", padded))
            assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        writer.close()
        # pipelined: a large request and the start of the next head in one write, its end in another
        reader, writer = await _open(r.url)
        second = _post("/api/chat", body)
        tenk = json.dumps({**CHAT, "options": {"pad": "p" * 10_000}}).encode()  # (one read: one segment)
        writer.write(_post("/api/chat", tenk) + second[:30])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(second[30:])
        assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        assert (await read_response(reader))[0] == b"HTTP/1.1 200 OK"
        writer.close()


# ---- the body's total time --------------------------------------------------------------
async def test_bodies_trickling_past_body_timeout_get_408_and_free_everything(mock):
    cfg = {"endpoints": endpoints(mock), "body_timeout": 1.0, "body_idle_timeout": 10.0, "max_connections": 31}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        conns = [await _open(r.url) for _ in range(30)]
        for _, w in conns:
            w.write(b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")
        budget = r.router.body_budget
        for _ in range(50):
            if budget.held == 30 * 100:  # each declared length is reserved before its body is read
                break
            await asyncio.sleep(0.01)
        assert budget.held == 30 * 100
        async with s.get(r.url + "/api/tags") as resp:  # they count toward max_connections
            assert resp.status == 503

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
            while not reader.at_eof():  # one byte every 0.2 s, never idle for body_idle_timeout
                try:
                    writer.write(b" ")
                    await writer.drain()
                except ConnectionError:
                    break
                try:
                    return await asyncio.wait_for(reader.read(), 0.2)
                except TimeoutError:
                    continue
            return await reader.read()

        replies = await asyncio.wait_for(asyncio.gather(*(trickle(*c) for c in conns)), 10)
        assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies)
        assert budget.held == 0
        h = await _health(s, r.url)
        assert h["queue_length"] == 0 and all(e["in_flight"] == 0 for e in h["endpoints"])
        async with s.post(r.url + "/api/chat", json=CHAT) as resp:  # and everyone else is served
            assert resp.status == 200


async def test_a_blob_upload_is_bounded_by_idleness_only(mock):
    blob = b"b" * 4000
    digest = "sha256:" + __import__("hashlib").sha256(blob).hexdigest()
    cfg = {"endpoints": endpoints(mock), "body_timeout": 0.3, "body_idle_timeout": 5.0}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:

        async def slowly() -> Any:
            for i in range(0, len(blob), 1000):  # 4 pieces over ~0.8 s: past body_timeout
                yield blob[i : i + 1000]
                await asyncio.sleep(0.2)

        async with s.post(r.url + "/api/blobs/" + digest, data=slowly()) as resp:
            assert resp.status == 201
        assert mock.stats()["requests"]["/api/blobs"] == 2  # its HEAD, then the upload


# ---- bodies held while queued -----------------------------------------------------------
async def test_queued_bodies_past_max_queued_body_bytes_get_503_queue_full():
    async with run_mock(ttft_ms=30_000, tok_ms=0, tokens=1) as m:  # the first answer never comes in time
        cfg = {"endpoints": endpoints(m, slots=1), "max_queued_body_bytes": 1_000_000}
        big = {**CHAT, "messages": [{"role": "user", "content": "q" * 400_000}]}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            budget = r.router.body_budget

            async def post(body: dict[str, Any]) -> int:
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    return resp.status

            first = asyncio.create_task(post(CHAT))  # holds the one slot
            while (await _health(s, r.url))["endpoints"][0]["in_flight"] < 1:
                await asyncio.sleep(0.02)
            queued = [asyncio.create_task(post(big)) for _ in range(2)]  # 2 x 400 KB wait
            while (await _health(s, r.url))["queue_length"] < 2:
                await asyncio.sleep(0.02)
            assert 800_000 < budget.held <= 1_000_000
            async with s.post(r.url + "/api/chat", json=big) as resp:  # a third: past the budget
                assert resp.status == 503
                assert "max_queued_body_bytes" in (await resp.json())["error"]
                assert resp.headers["Retry-After"] == "1"
            async with s.post(r.url + "/v1/chat/completions", json=big) as resp:
                assert (await resp.json())["error"]["code"] == "queue_full"

            async def chunked() -> Any:  # no content-length: charged once read, then refused
                data = json.dumps(big).encode()
                for i in range(0, len(data), 100_000):
                    yield data[i : i + 100_000]

            async with s.post(r.url + "/api/chat", data=chunked()) as resp:
                assert resp.status == 503
            assert 800_000 < budget.held <= 1_000_000  # the refused ones gave theirs back
            for t in [first, *queued]:  # the clients leave: their queue places and bytes are freed
                t.cancel()
            await asyncio.gather(first, *queued, return_exceptions=True)
            for _ in range(100):
                if budget.held == 0 and (await _health(s, r.url))["queue_length"] == 0:
                    break
                await asyncio.sleep(0.05)
            assert budget.held == 0


# ---- every backend-touching route follows the key -----------------------------------------
KEY, FREE = "alice-key-0123456789", "bob-key-0123456789"


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_metadata_and_blob_routes_follow_the_keys_models_and_rpm_and_refusals_spend_none(mock):
    cfg = {
        "endpoints": endpoints(mock),
        "client_keys": [
            {"name": "alice", "key": KEY, "models": ["llama3"], "rpm": 3},
            {"name": "bob", "key": FREE, "rpm": 2},
        ],
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        for _ in range(3):  # refusals: none reaches a backend, none spends alice's rpm
            async with s.head(r.url + "/api/blobs/" + DIGEST, headers=_auth()) as resp:
                assert resp.status == 403
            async with s.post(r.url + "/api/blobs/" + DIGEST, data=b"x", headers=_auth()) as resp:
                assert resp.status == 403
            async with s.post(r.url + "/api/chat", json={**CHAT, "model": "qwen2.5:7b"}, headers=_auth()) as resp:
                assert resp.status == 403
            async with s.post(r.url + "/api/show", json={"model": "qwen2.5:7b"}, headers=_auth()) as resp:
                assert resp.status == 404
            async with s.post(r.url + "/api/chat", data=b"{", headers=_auth()) as resp:
                assert resp.status == 400
        assert "/api/blobs" not in mock.stats()["requests"]
        async with s.post(r.url + "/api/show", json={"model": "llama3"}, headers=_auth()) as resp:
            assert resp.status == 200
            assert resp.headers["x-ratelimit-remaining-requests"] == "2"
        async with s.get(r.url + "/api/status", headers=_auth()) as resp:
            assert resp.status == 200
            assert resp.headers["x-ratelimit-remaining-requests"] == "1"
        async with s.post(r.url + "/api/chat", json=CHAT, headers=_auth()) as resp:
            assert resp.status == 200
        shows = mock.stats()["requests"].get("/api/show", 0)
        for method, path, body in (("POST", "/api/show", {"model": "llama3"}), ("GET", "/api/status", None)):
            async with s.request(method, r.url + path, json=body, headers=_auth()) as resp:
                assert resp.status == 429
                assert resp.headers["x-ratelimit-remaining-requests"] == "0" and "Retry-After" in resp.headers
        async with s.post(r.url + "/api/chat", json=CHAT, headers=_auth()) as resp:
            assert resp.status == 429
        assert mock.stats()["requests"].get("/api/show", 0) == shows  # a 429 reaches no backend

        # a key without a model list may ask for blobs, within its rpm
        for expected in (404, 404, 429):
            async with s.head(r.url + "/api/blobs/" + DIGEST, headers=_auth(FREE)) as resp:
                assert resp.status == expected
        assert mock.stats()["requests"]["/api/blobs"] == 2


# ---- Host ---------------------------------------------------------------------------------
async def test_an_open_router_answers_only_local_host_names(mock):
    cfg = {"endpoints": endpoints(mock), "allowed_hosts": ["llm.example.com", "*.corp.example"]}
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:

        async def status(path: str, host: str | None) -> tuple[int, Any]:
            async with s.get(r.url + path, headers={"Host": host} if host else None) as resp:
                return resp.status, await resp.json(content_type=None)

        for host in ("evil.example", "evil.example:12434", "127.0.0.1.evil.example", "corp.example.evil"):
            code, body = await status("/api/usage", host)
            assert code == 421 and "allowed_hosts" in body["error"]
            assert (await status("/metrics", host))[0] == 421
        code, body = await status("/v1/models", "evil.example")
        assert code == 421 and body["error"]["type"] == "invalid_request_error"
        for host in (
            None,  # aiohttp's own: 127.0.0.1:<port>, the listen address
            "localhost",
            "localhost:9",
            "LOCALHOST.",
            "[::1]:12434",
            "10.1.2.3:12434",  # an address (a published port): DNS rebinding needs a name
            "ui.localhost",
            "router.internal:12434",
            "llm.example.com:443",
            "a.corp.example",
        ):
            assert (await status("/v1/models", host))[0] == 200, host

    keyed = {"endpoints": endpoints(mock), "client_keys": [{"name": "bob", "key": FREE}]}
    async with run_router(keyed) as r, aiohttp.ClientSession() as s:  # with keys, the key is the guard
        async with s.get(r.url + "/v1/models", headers={"Host": "evil.example", **_auth(FREE)}) as resp:
            assert resp.status == 200
        async with s.get(r.url + "/v1/models", headers={"Host": "evil.example"}) as resp:
            assert resp.status == 401


async def test_allowed_hosts_is_applied_by_a_reload(mock, tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"endpoints": endpoints(mock)}))
    from nomyo_router.config import load_config
    from nomyo_router.runtime import reconfigure

    async with run_router(load_config(str(path))) as r, aiohttp.ClientSession() as s:
        async with s.get(r.url + "/api/tags", headers={"Host": "llm.example.com"}) as resp:
            assert resp.status == 421
        path.write_text(json.dumps({"endpoints": endpoints(mock), "allowed_hosts": ["llm.example.com"]}))
        await reconfigure.apply(r.router, load_config(str(path)))
        async with s.get(r.url + "/api/tags", headers={"Host": "llm.example.com"}) as resp:
            assert resp.status == 200
