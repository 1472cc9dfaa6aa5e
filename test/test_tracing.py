"""OpenTelemetry traces on real sockets: an in-test OTLP/HTTP receiver decodes what the router
exports (opentelemetry-proto), mocks record the traceparent they were sent."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mock import free_port, run_mock
from nomyo_router.config import TracingConfig
from nomyo_router.ops.tracing import Settings, parse_traceparent
from test.conftest import FAST
from test.helpers import endpoints, run_router

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status  # noqa: E402

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


class Receiver:
    """An OTLP/HTTP collector: POST /v1/traces, protobuf in, every span kept with its resource."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.bodies.append(body)
        self.content_types.append(request.headers.get("Content-Type", ""))
        msg = pb.ExportTraceServiceRequest.FromString(body)
        for rs in msg.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                self.spans.extend((resource, s) for s in ss.spans)
        return web.Response(
            body=pb.ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait(self, predicate: Any, timeout: float = 8.0) -> list[Span]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            found = [s for _, s in self.spans if predicate(s)]
            if found:
                return found
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no such span among {[s.name for _, s in self.spans]}")
            await asyncio.sleep(0.05)

    def trace(self, trace_id: bytes) -> list[Span]:
        return [s for _, s in self.spans if s.trace_id == trace_id]


def attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", r.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield r, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def record_traceparents(mock: Any, seen: list[str | None]) -> None:
    """Every generation request the mock gets appends its traceparent header (or None)."""
    for key, handler in list(mock.backend.routes.items()):
        if key[0] == "POST" and key[1] in ("/api/chat", "/v1/chat/completions", "/api/generate"):

            async def wrapped(request: Any, _h: Any = handler) -> Any:
                seen.append(request.headers.get("traceparent"))
                return await _h(request)

            mock.backend.routes[key] = wrapped


def by_kind(spans: list[Span], kind: int) -> list[Span]:
    return [s for s in spans if s.kind == kind]


async def test_one_request_is_a_server_span_with_a_client_span_per_attempt():
    seen: list[str | None] = []
    async with receiver() as (rec, url), run_mock(**FAST) as m:
        record_traceparents(m, seen)
        config = {"endpoints": endpoints(m), "tracing": {"endpoint": url, "service_name": "router-test"}}
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            marker = "the secret prompt text 7b1d"
            async with s.post(
                r.url + "/api/chat",
                json={"model": "llama3", "stream": False, "messages": [{"role": "user", "content": marker}]},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01", "X-Session-ID": "conv-1"},
            ) as resp:
                assert resp.status == 200
                answer = await resp.json()
            server = (await rec.wait(lambda sp: sp.kind == Span.SPAN_KIND_SERVER))[0]
        assert rec.content_types[0] == "application/x-protobuf"
        assert all(marker.encode() not in body for body in rec.bodies)  # never prompt text
    resource = rec.spans[0][0]
    assert resource["service.name"] == "router-test"
    assert server.name == "chat llama3"
    assert server.trace_id.hex() == CLIENT_TRACE  # the client's trace, continued
    assert server.parent_span_id.hex() == CLIENT_PARENT
    a = attrs(server.attributes)
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "llama3"
    assert a["gen_ai.response.model"] == "llama3:latest"  # the backend's own name of it
    assert a["gen_ai.usage.input_tokens"] == answer["prompt_eval_count"]
    assert a["gen_ai.usage.output_tokens"] == answer["eval_count"] == FAST["tokens"]
    host, port = m.url.removeprefix("http://").split(":")
    assert (a["server.address"], a["server.port"]) == (host, int(port))
    assert a["nomyo.endpoint"] == "m0"
    assert a["nomyo.attempts"] == 1
    assert a["nomyo.resumed"] == 0
    assert a["nomyo.queue_ms"] >= 0
    assert a["nomyo.affinity"] in ("hit", "miss", "spill", "repin")
    assert a["http.response.status_code"] == 200
    assert server.status.code != Status.STATUS_CODE_ERROR
    assert server.end_time_unix_nano > server.start_time_unix_nano
    spans = rec.trace(server.trace_id)
    clients = by_kind(spans, Span.SPAN_KIND_CLIENT)
    assert len(clients) == 1 and len(spans) == 2  # no queue span: it did not wait
    client = clients[0]
    assert client.parent_span_id == server.span_id
    assert attrs(client.attributes)["server.port"] == int(port)
    assert (
        server.start_time_unix_nano
        <= client.start_time_unix_nano
        <= client.end_time_unix_nano
        <= server.end_time_unix_nano
    )
    # the backend was told the attempt span is its parent
    assert seen == [f"00-{CLIENT_TRACE}-{client.span_id.hex()}-01"]


async def test_a_retried_request_has_one_client_span_per_attempt():
    seen: list[str | None] = []
    async with receiver() as (rec, url), run_mock(**FAST, busy_rate=1.0) as busy, run_mock(**FAST) as ok:
        record_traceparents(busy, seen)
        record_traceparents(ok, seen)
        config = {
            "endpoints": endpoints(busy, ok),
            "tracing": {"endpoint": url},
            "eject_after": 1000,
            "routing": "least_busy",
            "retry_budget": 1.0,
        }
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            for i in range(40):  # (until the busy one was tried first)
                if busy.stats()["requests_total"]:
                    break
                async with s.post(
                    r.url + "/v1/chat/completions",
                    json={"model": "llama3", "messages": [{"role": "user", "content": f"hello {i}"}]},
                ) as resp:
                    assert resp.status == 200
            servers = await rec.wait(
                lambda sp: sp.kind == Span.SPAN_KIND_SERVER and attrs(sp.attributes)["nomyo.attempts"] == 2
            )
    server = servers[0]
    a = attrs(server.attributes)
    assert a["nomyo.endpoint"] == "m1" and a["gen_ai.operation.name"] == "chat"
    assert int(a["server.port"]) == int(ok.url.rsplit(":", 1)[1])
    clients = sorted(by_kind(rec.trace(server.trace_id), Span.SPAN_KIND_CLIENT), key=lambda sp: sp.start_time_unix_nano)
    assert [attrs(c.attributes)["nomyo.endpoint"] for c in clients] == ["m0", "m1"]
    assert clients[0].status.code == Status.STATUS_CODE_ERROR
    assert clients[1].status.code != Status.STATUS_CODE_ERROR
    assert clients[0].end_time_unix_nano <= clients[1].start_time_unix_nano
    for c in clients:
        assert c.parent_span_id == server.span_id
        assert f"00-{server.trace_id.hex()}-{c.span_id.hex()}-01" in seen


async def test_a_request_that_waited_has_a_queue_span():
    async with receiver() as (rec, url), run_mock(ttft_ms=300, tok_ms=0, tokens=2) as m:
        config = {"endpoints": endpoints(m, slots=1), "tracing": {"endpoint": url}}
        async with run_router(config) as r, aiohttp.ClientSession() as s:

            async def one(i: int) -> None:
                async with s.post(
                    r.url + "/api/generate", json={"model": "llama3", "prompt": f"p{i}", "stream": False}
                ) as resp:
                    assert resp.status == 200

            await asyncio.gather(one(1), one(2))
            queued = await rec.wait(lambda sp: "queue" in sp.name)
    q = queued[0]
    server = next(s for s in rec.trace(q.trace_id) if s.kind == Span.SPAN_KIND_SERVER)
    client = next(s for s in rec.trace(q.trace_id) if s.kind == Span.SPAN_KIND_CLIENT)
    assert server.name == "text_completion llama3"
    assert q.parent_span_id == server.span_id
    waited = attrs(server.attributes)["nomyo.queue_ms"]
    assert waited > 100 and abs(attrs(q.attributes)["nomyo.queue_ms"] - waited) < 1
    assert q.end_time_unix_nano <= client.start_time_unix_nano


async def test_sampling_follows_the_ratio_and_a_clients_sampled_flag():
    seen: list[str | None] = []
    async with receiver() as (rec, url), run_mock(**FAST) as m:
        record_traceparents(m, seen)
        config = {"endpoints": endpoints(m), "tracing": {"endpoint": url, "sample_ratio": 0.0}}
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            body = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
            async with s.post(r.url + "/api/chat", json=body) as resp:
                assert resp.status == 200
            async with s.post(
                r.url + "/api/chat", json=body, headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"}
            ) as resp:
                assert resp.status == 200
            # The exporter sends finished requests in the order they finished, so had the first
            # (unsampled) one been recorded, it would have come in this export or an earlier one.
            await rec.wait(lambda sp: sp.kind == Span.SPAN_KIND_SERVER)
    assert {s.trace_id.hex() for _, s in rec.spans} == {CLIENT_TRACE}
    # the unsampled request still told the backend its context, flagged not sampled
    assert seen[0] is not None and seen[0].endswith("-00") and CLIENT_TRACE not in seen[0]
    assert seen[1].startswith(f"00-{CLIENT_TRACE}-") and seen[1].endswith("-01")


async def test_off_sends_no_traceparent_and_builds_nothing():
    seen: list[str | None] = []
    async with run_mock(**FAST) as m:
        record_traceparents(m, seen)
        async with run_router({"endpoints": endpoints(m)}) as r, aiohttp.ClientSession() as s:
            assert r.router.tracer is None
            async with s.post(
                r.url + "/api/chat",
                json={"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]},
                headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"},
            ) as resp:
                assert resp.status == 200
    assert seen == [None]


async def test_a_collector_that_is_down_costs_no_request():
    # (a port held bound and never listening: every connection to it is refused, and no server
    # of a test running beside this one can take it meanwhile, as a port found free could be)
    with socket.socket() as down:
        down.bind(("127.0.0.1", 0))
        await _down_collector_costs_no_request(down.getsockname()[1])


async def _down_collector_costs_no_request(port: int) -> None:
    async with run_mock(**FAST) as m:
        config = {"endpoints": endpoints(m), "tracing": {"endpoint": f"http://127.0.0.1:{port}"}}
        async with run_router(config) as r, aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(
                    r.url + "/api/generate", json={"model": "llama3", "prompt": "x", "stream": True}
                ) as resp:
                    assert resp.status == 200
                    await resp.read()
            exporter = r.router.tracer.exporter
            for _ in range(100):
                if exporter.failed >= 3:
                    break
                await asyncio.sleep(0.05)
            assert exporter.failed == 3 and exporter.exported == 0  # (counted in requests, not spans)


async def test_a_black_hole_collector_holds_the_byte_budget_and_not_the_shutdown():
    """A collector that accepts and never answers: the exporter's batch waits on it, the
    requests finishing meanwhile are held up to `max_pending_bytes`, the rest dropped and
    counted exactly in /metrics; closing takes about a second, not the export's timeout."""
    hole = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # (never reads, never answers)
    port = hole.sockets[0].getsockname()[1]
    budget = 4096
    try:
        async with run_mock(**FAST) as m:
            config = {
                "endpoints": endpoints(m),
                "tracing": {"endpoint": f"http://127.0.0.1:{port}", "max_pending_bytes": budget},
            }
            async with run_router(config) as r, aiohttp.ClientSession() as s:
                exporter = r.router.tracer.exporter
                body = {"model": "llama3", "prompt": "x", "stream": False}
                async with s.post(r.url + "/api/generate", json=body) as resp:
                    assert resp.status == 200
                for _ in range(100):  # the first request's batch is sent into the hole
                    if exporter.pending() == 0:
                        break
                    await asyncio.sleep(0.05)
                for _ in range(30):
                    async with s.post(r.url + "/api/generate", json=body) as resp:
                        assert resp.status == 200
                    assert exporter.pending_bytes() <= budget
                held = exporter.pending()
                assert 1 <= held < 30 and exporter.over == 30 - held
                await asyncio.sleep(0.1)  # (counted on the loop, handed from the exporter)
                async with s.get(r.url + "/metrics") as resp:
                    text = await resp.text()
                line = next(x for x in text.splitlines() if 'what="traces_dropped"' in x and x.startswith("nomyo"))
                assert float(line.split()[-1]) == exporter.over + exporter.failed
                t0 = asyncio.get_running_loop().time()
                await asyncio.to_thread(r.router.tracer.close)
                assert asyncio.get_running_loop().time() - t0 < 3.0  # (the export's own timeout is 10 s)
    finally:
        hole.close()


def test_settings_take_the_environment_where_the_file_is_silent():
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_SERVICE_NAME": "gw",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-token=a%20b,other=1",
    }
    s = Settings(TracingConfig(), env)
    assert (s.url, s.service_name, s.sample_ratio) == ("http://collector:4318/v1/traces", "gw", 0.25)
    assert s.headers == {"x-token": "a b", "other": "1"}
    s = Settings(TracingConfig(endpoint="http://mine:4318", sample_ratio=1.0, service_name="me"), env)
    assert (s.url, s.service_name, s.sample_ratio) == ("http://mine:4318/v1/traces", "me", 1.0)
    s = Settings(TracingConfig(), {})
    assert (s.url, s.service_name, s.sample_ratio) == ("http://localhost:4318/v1/traces", "nomyo-router", 1.0)
    s = Settings(TracingConfig(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"})
    assert s.url == "http://c:4318/custom"


@pytest.mark.parametrize(
    "value, parsed",
    [
        (f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01", (int(CLIENT_TRACE, 16), int(CLIENT_PARENT, 16), True)),
        (f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-00", (int(CLIENT_TRACE, 16), int(CLIENT_PARENT, 16), False)),
        (f"01-{CLIENT_TRACE}-{CLIENT_PARENT}-03-future", (int(CLIENT_TRACE, 16), int(CLIENT_PARENT, 16), True)),
        (f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01-extra", None),  # version 00 has exactly four fields
        (f"ff-{CLIENT_TRACE}-{CLIENT_PARENT}-01", None),
        (f"00-{'0' * 32}-{CLIENT_PARENT}-01", None),
        (f"00-{CLIENT_TRACE}-{'0' * 16}-01", None),
        ("00-xyz-abc-01", None),
        ("", None),
    ],
)
def test_traceparent_parsing(value: str, parsed: Any):
    assert parse_traceparent(value.encode()) == parsed


def test_config_refuses_a_bad_tracing_mapping():
    from nomyo_router.config import ConfigError, parse_config

    for bad, says in [
        ({"sample_ratio": 2}, "tracing.sample_ratio"),
        ({"endpont": "http://x"}, "tracing.endpont"),
        ({"endpoint": "grpc://x:4317"}, "tracing.endpoint"),
    ]:
        with pytest.raises(ConfigError, match=says):
            parse_config({"endpoints": ["http://127.0.0.1:1"], "tracing": bad})
    assert parse_config({"endpoints": ["http://127.0.0.1:1"], "tracing": {}}).tracing == TracingConfig()
