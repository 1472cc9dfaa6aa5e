"""Ejection, retries, hung backends, fast return, and verdicts that account for the router's
own load. Real sockets: mocks and the router on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from mock import MockConfig, MockProcess, run_mock
from nomyo_router.relay.retry import RetryBudget, is_error_chunk
from test.conftest import FAST
from test.helpers import endpoints, run_router

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
STREAM = {**CHAT, "stream": True}


async def _load(url: str, s: aiohttp.ClientSession, clients: int, each: int) -> list[tuple[int, str, bytes]]:
    async def one(i: int) -> list[tuple[int, str, bytes]]:
        out = []
        for j in range(each):
            body = STREAM if (i + j) % 2 else CHAT
            async with s.post(url + "/api/chat", json=body) as r:
                out.append((r.status, r.headers.get("X-Router-Endpoint", ""), await r.read()))
        return out

    return [x for part in await asyncio.gather(*(one(i) for i in range(clients))) for x in part]


async def test_a_backend_answering_500_is_ejected_and_no_client_sees_it():
    async with run_mock(**FAST) as good, run_mock(**FAST, fail_rate=1.0) as bad:
        async with run_router({"endpoints": endpoints(good, bad, slots=8)}) as r, aiohttp.ClientSession() as s:
            results = await _load(r.url, s, 16, 20)
            assert [st for st, _, _ in results] == [200] * 320
            assert all(b'"error"' not in body for _, _, body in results)
            # Ejected after a few failures: it does not keep attracting traffic.
            assert bad.stats()["errors_injected"]["fail"] < 40
            async with s.get(r.url + "/health") as h:
                row = [e for e in (await h.json())["endpoints"] if e["name"] == "m1"][0]
            assert row["health"]["state"] in ("ejected", "trial")
            assert row["health"]["ejections"] >= 1


async def test_an_error_chunk_before_content_is_retried():
    async with run_mock(**FAST) as good:
        # A stand-in backend whose stream starts with an error chunk (what Ollama sends when
        # its runner fails right away): a raw HTTP server, not our mock.
        chats = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            data = await reader.readuntil(b"\r\n\r\n")
            if data.startswith(b"GET"):  # discovery and probes: it looks alive, model loaded
                body = b'{"version":"0.24.0","models":[{"name":"llama3:latest","model":"llama3:latest"}]}'
            else:
                length = [ln for ln in data.split(b"\r\n") if ln.lower().startswith(b"content-length")]
                await reader.readexactly(int(length[0].split(b":")[1]))
                chats.append(1)
                body = b'{"error":"an error was encountered while running the model: unexpected EOF"}\n'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        bad = {"url": f"http://127.0.0.1:{port}", "name": "bad", "type": "ollama", "models": ["llama3"]}
        cfg = {"endpoints": [bad, {"url": good.url, "name": "good"}], "routing": "least_busy"}
        async with server, run_router(cfg) as r, aiohttp.ClientSession() as s:
            for i in range(40):  # ties are broken at random: go on until the broken one was tried
                if i >= 6 and chats:
                    break
                async with s.post(r.url + "/api/chat", json=STREAM) as resp:
                    lines = [json.loads(x) for x in (await resp.read()).splitlines()]
                    assert resp.status == 200 and resp.headers["X-Router-Endpoint"] == "good"
                    assert lines[-1]["done"] is True and not any("error" in x for x in lines)
            assert chats  # the broken backend was tried, and its error never reached a client


async def test_a_hung_backend_is_left_within_the_deadline_and_ejected():
    async with run_mock(**FAST) as good, run_mock(**FAST, hang_rate=1.0) as hung:
        cfg = {"endpoints": endpoints(good, hung, slots=4), "first_byte_floor": 0.5, "routing": "least_busy"}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            results = await _load(r.url, s, 8, 4)
            took = time.monotonic() - t0
            assert [st for st, _, _ in results] == [200] * 32
            assert {ep for _, ep, _ in results} == {"m0"}
            assert took < 5  # a few deadlines of 0.5 s at most, never first_byte_timeout (300 s)
            snap = await r.router.store.snapshot()
            assert snap["in_flight"].get("m1", 0) == 0  # hung requests gave their slots back
            assert r.router.health.snapshot()["m1"]["state"] == "ejected"


async def test_a_restarted_backend_is_back_in_traffic_within_a_second():
    cfg = MockConfig(**FAST)
    with MockProcess(cfg) as a, MockProcess(cfg) as b:
        router_cfg = {"endpoints": endpoints(a, b), "health_interval": 5, "connect_timeout": 0.5}
        async with run_router(router_cfg) as r, aiohttp.ClientSession() as s:
            b.kill()
            ep_b = r.router.endpoints[1]
            for i in range(40):  # requests find it dead and eject it; none of them fails
                # distinct prompts: the cache-aware policy has no prefix to keep them all on `a`
                body = {**CHAT, "messages": [{"role": "user", "content": f"hi {i}"}]}
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    assert resp.status == 200
                if not r.router.store.is_healthy(ep_b):
                    break
            assert not r.router.store.is_healthy(ep_b)
            restarted = MockProcess(cfg, port=b.port).start()
            try:
                t0 = time.monotonic()
                while not r.router.store.is_healthy(ep_b):
                    assert time.monotonic() - t0 < 1.0, "not back within 1 s"
                    await asyncio.sleep(0.02)
            finally:
                restarted.stop()


async def test_a_blocked_event_loop_never_declares_the_only_backend_dead():
    """The overloaded router in small: the router's own loop is blocked longer than health_timeout while
    a probe is out; the probe times out, but the backend is fine and stays in rotation."""
    async with run_mock(**FAST) as only:
        cfg = {"endpoints": endpoints(only), "health_interval": 0.1, "health_timeout": 0.2}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            ep = r.router.endpoints[0]
            for _ in range(5):
                await asyncio.sleep(0.05)
                time.sleep(0.6)  # the router's loop (this loop) is blocked: probes time out
            await asyncio.sleep(0.3)
            assert r.router.store.is_healthy(ep)
            assert r.router.health.snapshot()["m0"]["state"] == "healthy"
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200
            async with s.get(r.url + "/health") as h:
                assert "loop_lag_ms" in await h.json()


async def test_probe_timeouts_alone_never_remove_the_last_endpoint_of_a_model():
    async with run_mock(**FAST) as slow:
        cfg = {"endpoints": endpoints(slow), "health_interval": 0.1, "health_timeout": 0.1}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            slow.update(first_byte_delay_ms=400)  # every probe now times out
            await asyncio.sleep(1.0)
            assert r.router.store.is_healthy(r.router.endpoints[0])
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                assert resp.status == 200


async def test_overload_is_an_explicit_503_not_a_false_verdict():
    async with run_mock(**FAST) as only:
        cfg = {"endpoints": endpoints(only), "overload_lag_ms": 50}
        async with run_router(cfg) as r:
            r.router.loop_lag.record(time.monotonic(), 0.2)  # as if the last tick was 200 ms late
            async with aiohttp.ClientSession() as s:
                async with s.post(r.url + "/v1/chat/completions", json={**CHAT, "stream": False}) as resp:
                    body = await resp.json()
                    assert resp.status == 503 and resp.headers["Retry-After"] == "1"
                    assert body["error"]["code"] == "router_overloaded"


async def test_clients_leaving_mid_stream_never_eject_a_backend():
    async with run_mock(ttft_ms=0, tok_ms=5, tokens=100) as m:
        async with run_router({"endpoints": endpoints(m, slots=64)}) as r:
            for _ in range(3):
                async with aiohttp.ClientSession() as s:

                    async def leave() -> None:
                        async with s.post(r.url + "/api/chat", json=STREAM) as resp:
                            await resp.content.readline()

                    await asyncio.gather(*(leave() for _ in range(30)))
            await asyncio.sleep(0.3)
            snap = await r.router.store.snapshot()
            assert snap["in_flight"].get("m0", 0) == 0 and snap["queue_length"] == 0
            assert r.router.health.snapshot()["m0"] == {
                **r.router.health.snapshot()["m0"],
                "state": "healthy",
                "ejections": 0,
            }


def test_retry_budget_caps_retries_at_a_share_of_requests():
    budget = RetryBudget(0.2, window=10, floor=5)
    for _ in range(100):
        budget.request()
    granted = sum(budget.allow() for _ in range(100))
    assert granted == 20


def test_error_chunks_are_recognised_in_both_stream_formats():
    assert is_error_chunk(b'{"error":"boom"}\n')
    assert is_error_chunk(b'data: {"error": {"message": "boom"}}\n\n')
    assert not is_error_chunk(b'{"model":"llama3","message":{"content":"error"}}\n')


async def _stream_text(s: aiohttp.ClientSession, url: str, api: str, body: dict) -> tuple[str, list[dict]]:
    path = "/api/chat" if api == "ollama" else "/v1/chat/completions"
    async with s.post(url + path, json=body) as r:
        assert r.status == 200
        raw = await r.read()
    if api == "ollama":
        recs = [json.loads(x) for x in raw.splitlines() if x.strip()]
        return "".join(x.get("message", {}).get("content", "") for x in recs), recs
    recs = [json.loads(x[5:]) for x in raw.split(b"\n\n") if x.startswith(b"data: {")]
    assert raw.rstrip().endswith(b"data: [DONE]") and raw.count(b"[DONE]") == 1
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in recs if c.get("choices")), recs


async def test_a_stream_cut_mid_way_is_resumed_elsewhere_with_identical_text():
    # 120 tokens: ~12 KB per stream, so cuts also fall after what `Sent` keeps compressed
    async with (
        run_mock(ttft_ms=0, tok_ms=0, tokens=120) as good,
        run_mock(ttft_ms=0, tok_ms=0, tokens=120, drop_rate=1.0) as dropping,
    ):
        cfg = {"endpoints": endpoints(dropping, good, slots=4), "routing": "least_busy", "eject_after": 1000}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            direct_ollama, _ = await _stream_text(s, good.url, "ollama", STREAM)
            body_oa = {
                "model": "llama3",
                "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hi"}],
            }
            direct_openai, _ = await _stream_text(s, good.url, "openai", body_oa)
            resumed = 0
            for _ in range(6):
                text, recs = await _stream_text(s, r.url, "ollama", STREAM)
                assert text == direct_ollama and not any("error" in x for x in recs)
                assert sum(1 for x in recs if x.get("done")) == 1 and recs[-1]["eval_count"] == 120
                text, recs = await _stream_text(s, r.url, "openai", body_oa)
                assert text == direct_openai and not any("error" in x for x in recs)
                roles = [c for c in recs if c.get("choices") and "role" in c["choices"][0]["delta"]]
                assert len(roles) == 1 and recs[-1]["usage"]["completion_tokens"] == 120
            resumed = dropping.stats()["errors_injected"]["drop"]
            assert resumed >= 2  # the dropping backend was really used and cut streams
