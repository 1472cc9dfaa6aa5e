"""The OpenTelemetry GenAI conventions in full on the router's spans, decoded from the OTLP it
exports: provider, request parameters, response id and finish reasons, token counts, and an
error's class (a 404's is "404", not "error"). An Ollama endpoint and an OpenAI-type one,
whole answers and streams, through the router's two client APIs."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from mock import run_mock
from test.conftest import FAST

pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
from opentelemetry.proto.trace.v1.trace_pb2 import Span  # noqa: E402

from test.helpers import run_router  # noqa: E402
from test.test_tracing import receiver  # noqa: E402


def attrs(span: Span) -> dict[str, Any]:
    """The span's attributes as Python values (an array as a list)."""
    out: dict[str, Any] = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        value = getattr(kv.value, which)
        if which == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        assert kv.key not in out, f"{kv.key} twice"
        out[kv.key] = value
    return out


async def test_spans_carry_the_genai_attributes_in_full():
    async with (
        receiver() as (rec, url),
        run_mock(**FAST, models=["llama3"]) as ollama,
        run_mock(**FAST, models=["tiny"]) as openai,
    ):
        config = {
            "endpoints": [
                {"url": ollama.url, "name": "ol", "max_concurrent": 2},
                {"url": openai.url, "name": "oa", "type": "openai", "max_concurrent": 2},
            ],
            "tracing": {"endpoint": url},
        }
        async with run_router(config) as r, aiohttp.ClientSession() as s:

            async def call(rid: str, path: str, body: dict[str, Any], status: int = 200) -> bytes:
                async with s.post(r.url + path, json=body, headers={"X-Request-ID": rid}) as resp:
                    assert resp.status == status
                    return await resp.read()

            messages = [{"role": "user", "content": "hi"}]
            whole = await call(
                "oa-whole",
                "/v1/chat/completions",
                {"model": "tiny", "messages": messages, "max_tokens": 3, "temperature": 0.25, "top_p": 0.5},
            )
            stream = await call(
                "oa-stream", "/v1/chat/completions", {"model": "tiny", "messages": messages, "stream": True}
            )
            await call(
                "ol-stream",
                "/api/chat",
                {
                    "model": "llama3",
                    "messages": messages,
                    "options": {"num_predict": 20, "temperature": 0.7, "top_p": 0.9},
                },
            )
            await call("missing", "/api/chat", {"model": "no-such-model", "messages": messages}, status=404)
            wanted = {"oa-whole", "oa-stream", "ol-stream", "missing"}
            await rec.wait(lambda sp: wanted <= {attrs(x).get("nomyo.request_id") for _, x in rec.spans})

    def server(rid: str) -> tuple[Span, dict[str, Any]]:
        (span,) = [s for _, s in rec.spans if s.kind == Span.SPAN_KIND_SERVER and attrs(s)["nomyo.request_id"] == rid]
        return span, attrs(span)

    def client(span: Span) -> dict[str, Any]:
        (c,) = [s for _, s in rec.spans if s.kind == Span.SPAN_KIND_CLIENT and s.parent_span_id == span.span_id]
        return attrs(c)

    answer = json.loads(whole)
    span, a = server("oa-whole")
    assert {k: v for k, v in a.items() if k.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny",
        "gen_ai.response.model": "tiny",
        "gen_ai.request.max_tokens": 3,
        "gen_ai.request.temperature": 0.25,
        "gen_ai.request.top_p": 0.5,
        "gen_ai.response.id": answer["id"],
        "gen_ai.response.finish_reasons": ["length"],  # capped by max_tokens
        "gen_ai.usage.input_tokens": answer["usage"]["prompt_tokens"],
        "gen_ai.usage.output_tokens": 3,
    }
    c = client(span)  # the attempt has what it asked and what it got, by its own endpoint
    assert c["gen_ai.provider.name"] == "openai" and c["gen_ai.request.max_tokens"] == 3
    assert c["gen_ai.response.id"] == answer["id"] and c["gen_ai.response.finish_reasons"] == ["length"]

    chunks = [json.loads(x[6:]) for x in stream.decode().split("\n\n") if x.startswith("data: {")]
    _, a = server("oa-stream")
    assert a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.response.id"] == chunks[0]["id"]
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.usage.output_tokens"] == FAST["tokens"]
    assert "gen_ai.request.max_tokens" not in a  # not asked

    _, a = server("ol-stream")
    assert a["gen_ai.provider.name"] == "ollama"
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (
        20,
        0.7,
        0.9,
    )
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.usage.output_tokens"] == FAST["tokens"]
    assert "gen_ai.response.id" not in a  # Ollama's answers have none

    _, a = server("missing")
    assert a["error.type"] == "404" and a["http.response.status_code"] == 404
    assert "gen_ai.provider.name" not in a  # no backend was asked
