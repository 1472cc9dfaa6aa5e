"""Per-endpoint latency metrics: time to first byte and output tokens per second by endpoint
and model, queue wait by client key, on real sockets."""

from __future__ import annotations

import re

import aiohttp

from mock import run_mock
from test.helpers import endpoints, run_router

KEY = "metrics-client-0123456789"
ADMIN = "admin-key-0123456789"


def value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{series} not in /metrics"
    return float(m.group(1))


async def test_ttft_and_decode_speed_by_endpoint_and_model_and_queue_wait_by_client():
    async with run_mock(ttft_ms=50, tok_ms=10, tokens=21) as m:
        cfg = {"endpoints": endpoints(m), "client_keys": [{"name": "team", "key": KEY}], "admin_key": ADMIN}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            for stream in (True, False):
                async with s.post(
                    r.url + "/api/chat",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"model": "llama3", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
            r.router.metrics.flush()
            async with s.get(r.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
                text = await resp.text()
    labels = 'endpoint="m0",model="llama3"'
    assert value(text, f"nomyo_router_endpoint_model_time_to_first_byte_seconds_count{{{labels}}}") == 2
    ttft_sum = value(text, f"nomyo_router_endpoint_model_time_to_first_byte_seconds_sum{{{labels}}}")
    assert ttft_sum > 0.05  # the stream's first token after ~50 ms, the whole answer after ~250 ms
    # only the stream has a decode speed: 20 tokens after the first, ~10 ms apart
    assert value(text, f"nomyo_router_output_tokens_per_second_count{{{labels}}}") == 1
    rate = value(text, f"nomyo_router_output_tokens_per_second_sum{{{labels}}}")
    assert 20 < rate < 150, rate
    assert value(text, 'nomyo_router_client_queue_wait_seconds_count{client="team"}') == 2
