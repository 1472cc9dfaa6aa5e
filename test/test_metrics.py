"""/metrics: Prometheus exposition from prometheus-client, exact across workers."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp

from mock import MockConfig, MockProcess
from test.helpers import endpoints, run_router
from test.router_proc import router_workers

CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}


def value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_metrics_count_requests_and_describe_state(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r, aiohttp.ClientSession() as s:
        for stream in (False, True, True):
            async with s.post(r.url + "/api/chat", json={**CHAT, "stream": stream}) as resp:
                await resp.read()
        async with s.get(r.url + "/metrics") as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    assert value(text, "nomyo_router_requests_total", model="llama3", status="200") == 3
    assert value(text, "nomyo_router_time_to_first_byte_seconds_count", model="llama3") == 3
    assert value(text, "nomyo_router_slots", endpoint="m0") == 2
    assert value(text, "nomyo_router_endpoint_healthy", endpoint="m0") == 1
    assert "nomyo_router_loop_lag_seconds" in text and "nomyo_router_queued" in text


async def test_one_scrape_counts_every_worker_and_survives_a_killed_worker():
    with MockProcess(MockConfig(ttft_ms=0, tok_ms=0, tokens=4, parallel=64)) as m:
        cfg = {"endpoints": [{"url": m.url, "name": "m", "max_concurrent": 16}]}
        with router_workers(cfg, 2) as (url, _):
            # a fresh connection per request, so both workers serve some
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
                pids = set()

                async def one(i: int) -> None:
                    async with s.post(url + "/api/chat", json={**CHAT, "stream": i % 5 < 2}) as resp:
                        await resp.read()
                        assert resp.status == 200
                        pids.add(resp.headers["X-Router-Worker"])

                sent = 0
                while sent < 100 or (len(pids) < 2 and sent < 400):  # until both workers served some
                    await asyncio.gather(*(one(sent + i) for i in range(10)))
                    sent += 10
                assert len(pids) == 2
                for _ in range(20):  # a worker records a request just after its last byte went out
                    async with s.get(url + "/metrics") as resp:
                        text = await resp.text()
                    if value(text, "nomyo_router_requests_total", model="llama3") >= sent:
                        break
                    await asyncio.sleep(0.05)
                # one scrape, whichever worker answers it, counts every worker's requests exactly
                assert value(text, "nomyo_router_requests_total", model="llama3") == sent
                assert value(text, "nomyo_router_time_to_first_byte_seconds_count", model="llama3") == sent
                os.kill(int(sorted(pids)[0]), signal.SIGKILL)
                await asyncio.sleep(1.0)
                for _ in range(20):  # whichever worker answers: never below what was counted
                    async with s.get(url + "/metrics") as resp:
                        if resp.status == 200:
                            assert value(await resp.text(), "nomyo_router_requests_total", model="llama3") >= sent


async def test_access_lines_and_request_ids(mock, caplog):
    import json as _json
    import logging

    secret = {**CHAT, "messages": [{"role": "user", "content": "zebra-secret-prompt"}]}
    async with (
        run_router({"endpoints": endpoints(mock), "access_log": True, "log_format": "json"}) as r,
        aiohttp.ClientSession() as s,
    ):
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            async with s.post(r.url + "/api/chat", json=secret, headers={"X-Request-ID": "abc-123"}) as resp:
                assert resp.headers["X-Request-ID"] == "abc-123"
                await resp.read()
            async with s.post(r.url + "/api/chat", json=CHAT) as resp:
                generated = resp.headers["X-Request-ID"]
                await resp.read()
    lines = [dict(rec.access) for rec in caplog.records if rec.name == "nomyo_router.access"]
    assert [x["request_id"] for x in lines] == ["abc-123", generated]
    assert lines[0]["model"] == "llama3" and lines[0]["endpoint"] == "m0" and lines[0]["status"] == 200
    assert "zebra" not in _json.dumps(lines)  # never prompt text


async def test_token_counts_come_from_the_backends_answers(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r, aiohttp.ClientSession() as s:
        for stream in (False, True):
            async with s.post(r.url + "/api/chat", json={**CHAT, "stream": stream}) as resp:
                await resp.read()
        body = {
            "model": "llama3",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
        }
        async with s.post(r.url + "/v1/chat/completions", json=body) as resp:
            await resp.read()
        async with s.get(r.url + "/metrics") as resp:
            text = await resp.text()
    # the mock answers 8 tokens each time (tests' FAST settings)
    assert value(text, "nomyo_router_tokens_total", model="llama3", kind="completion") == 24
    assert value(text, "nomyo_router_tokens_total", model="llama3", kind="prompt") > 0
