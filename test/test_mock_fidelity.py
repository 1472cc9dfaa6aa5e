"""The mock answers `n`, `tools`, JSON schemas and `encoding_format: base64` the way real
servers do, checked with the official clients through the router (pass-through)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from test.helpers import endpoints, run_router

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather in a city",
        "parameters": {
            "type": "object",
            "required": ["city", "days"],
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1},
                "unit": {"type": "string", "enum": ["C", "F"]},
            },
        },
    },
}
SCHEMA = {
    "type": "object",
    "required": ["name", "age", "tags", "address"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "required": ["zip"],
            "properties": {"zip": {"type": "string"}, "n": {"type": "number"}},
        },
        "ok": {"type": "boolean"},
    },
}


def _satisfies(doc, schema=SCHEMA) -> None:
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    assert isinstance(doc, types[schema["type"]])
    if schema["type"] == "object":
        for key in schema.get("required", []):
            assert key in doc
        for key, sub in schema.get("properties", {}).items():
            if key in doc:
                _satisfies(doc[key], sub)
    if schema["type"] == "array":
        for item in doc:
            _satisfies(item, schema["items"])


@pytest.fixture
async def router(mock):
    async with run_router({"endpoints": endpoints(mock)}) as r:
        yield r


async def test_n_choices_stream_and_not(router, clients):
    client = clients.openai(router.url)
    ask = dict(model="llama3", messages=[{"role": "user", "content": "hi"}], n=3)
    out = await client.chat.completions.create(**ask)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.message.content for c in out.choices}) == 1 and out.choices[2].message.content
    texts = {0: "", 1: "", 2: ""}
    finishes = {}
    async for chunk in await client.chat.completions.create(**ask, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts[0] == texts[1] == texts[2] == out.choices[0].message.content
    assert finishes == {0: "stop", 1: "stop", 2: "stop"}
    done = await client.completions.create(model="llama3", prompt="hi", n=2)
    assert [c.index for c in done.choices] == [0, 1]


async def test_openai_tool_call_stream_and_not(router, clients):
    client = clients.openai(router.url)
    ask = dict(model="llama3", messages=[{"role": "user", "content": "weather in Paris?"}], tools=[WEATHER])
    out = await client.chat.completions.create(**ask)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    args = json.loads(choice.message.tool_calls[0].function.arguments)
    assert isinstance(args["city"], str) and isinstance(args["days"], int) and args["days"] >= 1
    assert args["unit"] in ("C", "F")
    name, arguments, finish = "", "", None
    async for chunk in await client.chat.completions.create(**ask, stream=True):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                name += tc.function.name or ""
                arguments += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert (name, json.loads(arguments), finish) == ("get_weather", args, "tool_calls")
    # after the tool's result: a plain answer again
    follow = ask["messages"] + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "sunny"},
    ]
    final = await client.chat.completions.create(**{**ask, "messages": follow})
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content
    none = await client.chat.completions.create(**ask, tool_choice="none")
    assert not none.choices[0].message.tool_calls


async def test_ollama_tool_call_has_object_arguments(router, clients):
    client = clients.ollama(router.url)
    ask = dict(model="llama3", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER])
    out = await client.chat(**ask, stream=False)
    call = out.message.tool_calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments["days"], int)
    calls = []
    async for part in await client.chat(**ask, stream=True):
        calls += part.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]


async def test_json_schema_output(router, clients):
    oa = clients.openai(router.url)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    out = await oa.chat.completions.create(
        model="llama3", messages=[{"role": "user", "content": "x"}], response_format=fmt
    )
    _satisfies(json.loads(out.choices[0].message.content))
    text = ""
    async for chunk in await oa.chat.completions.create(
        model="llama3",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_object"},
        stream=True,
    ):
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert isinstance(json.loads(text), dict)
    ol = clients.ollama(router.url)
    got = await ol.chat(model="llama3", messages=[{"role": "user", "content": "x"}], format=SCHEMA, stream=False)
    _satisfies(json.loads(got.message.content))
    gen = await ol.generate(model="llama3", prompt="x", format="json", stream=False)
    assert isinstance(json.loads(gen.response), dict)


async def test_base64_embeddings(router, clients):
    client = clients.openai(router.url)
    floats = await client.embeddings.create(model="llama3", input=["a", "b"], encoding_format="float")
    packed = await client.embeddings.with_raw_response.create(
        model="llama3", input=["a", "b"], encoding_format="base64"
    )
    raw = json.loads(packed.text)["data"][0]["embedding"]
    assert isinstance(raw, str)
    vec = struct.unpack(f"<{len(floats.data[0].embedding)}f", base64.b64decode(raw))
    assert vec == pytest.approx(floats.data[0].embedding, abs=1e-6)
    parsed = await client.embeddings.create(model="llama3", input=["a", "b"])  # the client asks base64 itself
    assert parsed.data[1].embedding == pytest.approx(floats.data[1].embedding, abs=1e-6)
