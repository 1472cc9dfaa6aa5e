"""Every request ends in one place: one refused at the door is counted in
nomyo_router_requests_total with its status and reason, written as an access line and
exported as a span, as a proxied one is (its Exchange is made when the request is read)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from mock import run_mock
from test.conftest import FAST
from test.helpers import endpoints, run_router

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from test.test_tracing import attrs, receiver  # noqa: E402

LIMITED = "limited-key-0123456789"
NARROW = "narrow-key-0123456789"
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "x"}]}
LONG = {**CHAT, "messages": [{"role": "user", "content": "x" * 8000}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def requests_total(text: str) -> dict[tuple[str, str], float]:
    """(status, reason) -> count, from /metrics."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("nomyo_router_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(","))
            key = (labels["status"].strip('"'), labels["reason"].strip('"'))
            out[key] = out.get(key, 0.0) + float(line.split()[-1])
    return out


async def test_each_refusal_is_counted_logged_and_traced(caplog: Any):
    caplog.set_level(logging.INFO, logger="nomyo_router.access")
    async with run_mock(**FAST) as m, receiver() as (spans, collector):
        config = {
            "endpoints": endpoints(m),
            "access_log": True,
            "max_body_bytes": 4096,
            "tracing": {"endpoint": collector},
            "client_keys": [
                {"name": "alice", "key": LIMITED, "rpm": 1},
                {"name": "bob", "key": NARROW, "models": ["qwen2.5:7b"]},
            ],
        }
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            url = r.url + "/v1/chat/completions"
            asked = [
                (url, CHAT, {}, 401, "auth"),
                (url, CHAT, bearer("wrong-key-0123456789"), 401, "auth"),
                (url, CHAT, bearer(NARROW), 403, "forbidden_model"),
                (url, CHAT, bearer(LIMITED), 200, ""),
                (url, CHAT, bearer(LIMITED), 429, "rate_limited"),
                (url, {"model": "llama3", "messages": "not a list"}, bearer(NARROW), 400, "bad_request"),
                (url, LONG, bearer(NARROW), 413, "too_large"),
                (r.url + "/v1/nothing-here", CHAT, bearer(NARROW), 404, "not_found"),
            ]
            for where, body, headers, status, _ in asked:
                async with s.post(where, json=body, headers=headers) as resp:
                    assert resp.status == status, (where, headers, await resp.text())
                    await resp.read()
            async with s.get(r.url + "/metrics") as resp:  # (an operator's route, refused: recorded too)
                assert resp.status == 401
            counted = requests_total(r.router.metrics.render().decode())
            want: dict[tuple[str, str], float] = {("401", "auth"): 1.0}
            for _, _, _, status, reason in asked:
                want[(str(status), reason)] = want.get((str(status), reason), 0.0) + 1
            assert counted == want
            # one access line each, refusals included
            lines = [rec.getMessage() for rec in caplog.records if rec.name == "nomyo_router.access"]
            assert len(lines) == len(asked) + 1, lines
            for _, _, _, status, _ in asked:
                assert any(f"status={status}" in line or f'"status": {status}' in line for line in lines), status
            # one span each for the generation route's requests, refused at the door or not
            generation = [a for a in asked if a[0] == url]
            found = await spans.wait(lambda sp: len(spans.spans) >= len(generation))
            assert found
            statuses = sorted(
                attrs(sp.attributes).get("http.response.status_code")
                for _, sp in spans.spans
                if sp.kind == sp.SPAN_KIND_SERVER
            )
            assert statuses == sorted(a[3] for a in generation), statuses
