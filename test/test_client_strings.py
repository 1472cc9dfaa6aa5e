"""Client strings are bounded, on real sockets: a model name longer than MAX_MODEL_BYTES is a
400 in the caller's API shape before anything records it; a name no endpoint serves is
`(unknown)` in the access line, the usage stream and every other listener (as in /metrics);
and a usage-stream reader is let go only for its own slowness."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest

from mock import run_mock
from nomyo_router.api.requests import MAX_MODEL_BYTES
from nomyo_router.events import RequestRecord
from nomyo_router.ops.metrics import UNKNOWN_MODEL
from nomyo_router.ops.usage import stream as usage_stream
from test.conftest import FAST
from test.helpers import endpoints, run_router

MSGS = [{"role": "user", "content": "hi"}]


async def test_a_long_model_name_is_a_400_in_the_api_s_shape_and_recorded_nowhere():
    """Refused as the body is parsed: the request is recorded (every request is), but its
    record never holds the name, only the placeholder."""
    seen: list[str] = []
    async with run_mock(**FAST) as m, run_router({"endpoints": endpoints(m)}) as r:
        r.router.events.on_request_start(lambda rec: seen.append(rec.model))
        r.router.events.on_request_done(lambda rec: seen.append(rec.model))
        async with httpx.AsyncClient(timeout=10) as c:
            long = "é" * (MAX_MODEL_BYTES // 2 + 1)  # (characters under the bound, bytes over it)
            resp = await c.post(r.url + "/v1/chat/completions", json={"model": long, "messages": MSGS})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "model"
            resp = await c.post(r.url + "/api/chat", json={"model": "m" * (2 << 20), "messages": MSGS})
            assert resp.status_code == 400 and set(resp.json()) == {"error"}
            files = {"file": ("a.wav", b"RIFF"), "model": (None, "w" * (MAX_MODEL_BYTES + 1))}
            resp = await c.post(r.url + "/v1/audio/transcriptions", files=files)
            assert resp.status_code == 400
            assert seen == [UNKNOWN_MODEL] * 3  # recorded, the name never
            # at the bound: an ordinary unknown model
            resp = await c.post(r.url + "/api/chat", json={"model": "é" * (MAX_MODEL_BYTES // 2), "messages": MSGS})
            assert resp.status_code == 404
    assert m.stats()["requests_total"] == 0


async def test_an_unknown_name_is_a_placeholder_in_access_lines_and_the_usage_stream(caplog):
    caplog.set_level(logging.INFO, logger="nomyo_router.access")
    got: list[tuple[str, dict[str, Any]]] = []
    async with run_mock(**FAST) as m, run_router({"endpoints": endpoints(m), "access_log": True}) as r:
        async with httpx.AsyncClient(timeout=10) as c, c.stream("GET", r.url + "/api/usage-stream") as stream:

            async def read() -> None:
                kind = ""
                async for line in stream.aiter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:") and kind in ("start", "done"):
                        got.append((kind, json.loads(line[5:])))
                        if len(got) == 4:
                            return

            reader = asyncio.create_task(read())
            while not r.router.usage_stream.subs:
                await asyncio.sleep(0.01)
            secret = "guess-" + "z" * 200
            resp = await c.post(r.url + "/api/chat", json={"model": secret, "messages": MSGS, "stream": False})
            assert resp.status_code == 404 and secret in resp.text  # the client is told its own name
            resp = await c.post(r.url + "/api/chat", json={"model": "llama3", "messages": MSGS, "stream": False})
            assert resp.status_code == 200
            await asyncio.wait_for(reader, 10)
    assert [(k, d["model"]) for k, d in got] == [
        ("start", UNKNOWN_MODEL),
        ("done", UNKNOWN_MODEL),
        ("start", "llama3"),
        ("done", "llama3"),
    ]
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "nomyo_router.access"]
    assert len(lines) == 2 and "guess-" not in "".join(lines) and UNKNOWN_MODEL in lines[0]


def test_a_reader_is_dropped_for_its_own_slowness_only():
    sub = usage_stream.Subscriber()
    sub.put(b"x" * (usage_stream.MAX_PENDING + 1))  # one event larger than the bound: it waits whole
    assert not sub.dropped and sub.take()
    sub.put(b"y" * (usage_stream.MAX_PENDING // 2))
    sub.put(b"y" * (usage_stream.MAX_PENDING // 2 + 1))  # behind by more than the bound: let go
    assert sub.dropped


@pytest.mark.parametrize("ended", [False, True])
def test_every_listener_sees_the_placeholder_for_a_name_nobody_serves(ended):
    """The router names the record once, before any listener (metrics, usage, access lines,
    spans) reads it; a request an endpoint took keeps its name."""
    from nomyo_router.config import parse_config
    from nomyo_router.runtime.router import Router

    router = Router(parse_config({"endpoints": [{"url": "http://127.0.0.1:9", "name": "a", "models": ["llama3"]}]}))
    rec = RequestRecord("1", "ollama", "/api/chat", "llama3" if ended else "nope", False)
    if ended:
        rec.endpoint = "a"
    router.events.request_done(rec)
    assert rec.model == ("llama3" if ended else UNKNOWN_MODEL)


async def test_spans_name_an_unknown_model_by_the_placeholder():
    tracing = pytest.importorskip("test.test_tracing")
    async with run_mock(**FAST) as m, tracing.receiver() as (rx, url):
        config = {"endpoints": endpoints(m), "tracing": {"endpoint": url, "sample_ratio": 1.0}}
        async with run_router(config) as r, httpx.AsyncClient(timeout=10) as c:
            for i in range(3):
                body = {"model": f"guess-{i}-" + "z" * 200, "messages": MSGS, "stream": False}
                assert (await c.post(r.url + "/api/chat", json=body)).status_code == 404
            for _ in range(100):  # (the exporter sends its batch within a second)
                if len([s for _, s in rx.spans if s.kind == tracing.Span.SPAN_KIND_SERVER]) >= 3:
                    break
                await asyncio.sleep(0.05)
    server = [s for _, s in rx.spans if s.kind == tracing.Span.SPAN_KIND_SERVER]
    models = {tracing.attrs(s.attributes)["gen_ai.request.model"] for s in server}
    assert len(server) == 3 and models == {UNKNOWN_MODEL} and not any("guess-" in s.name for _, s in rx.spans)


def test_the_span_template_cache_is_bounded_in_bytes():
    """Names are bounded at the door and unknown ones are one placeholder; the cache of span
    templates is bounded in bytes besides (models and routes come and go with reloads)."""
    pytest.importorskip("opentelemetry.proto.trace.v1.trace_pb2")
    from nomyo_router.config import TracingConfig
    from nomyo_router.ops import otlp
    from nomyo_router.ops.tracing import Settings

    exporter = otlp.Exporter(Settings(TracingConfig(endpoint="http://127.0.0.1:9"), env={}))
    longest = 0
    for i in range(4000):  # (past the byte bound before MAX_TEMPLATES entries)
        model = f"{i:06d}" + "m" * (MAX_MODEL_BYTES - 6)
        exporter._template(("chat", model), otlp.SERVER, "chat", model, None, None, "/api/chat")
        longest = max(longest, exporter._template_bytes)
    assert longest <= otlp.MAX_TEMPLATE_BYTES + 4 * MAX_MODEL_BYTES  # (one template past the bound at most)
    assert len(exporter._templates) < 4000  # it was emptied on the way
