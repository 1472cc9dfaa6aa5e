"""Exact translation, Ollama API -> OpenAI-type backend and back: tools and tool-call history,
tool calls with object arguments (stream and not) parsed by the official ollama client,
think/reasoning, the options vLLM and llama.cpp accept, and durations from the router's timing."""

from __future__ import annotations

import json

import pytest

from mock import run_mock
from nomyo_router.backends.translate import SseToNdjson, request_to_openai, response_to_ollama
from test.helpers import run_router

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "required": ["city", "days"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}


def test_tool_history_options_and_think_map_to_openai():
    body = {
        "model": "m",
        "tools": [WEATHER],
        "think": True,
        "options": {"top_k": 20, "min_p": 0.05, "repeat_penalty": 1.1, "num_ctx": 8192, "typical_p": 0.9},
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                    {"function": {"name": "get_time", "arguments": {}}},
                ],
            },
            {"role": "tool", "content": "12:00", "tool_name": "get_time"},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
    }
    out = json.loads(request_to_openai("chat", body, "backend", stream=False))
    assert out["tools"] == [WEATHER]
    calls = out["messages"][1]["tool_calls"]
    assert [c["type"] for c in calls] == ["function", "function"] and calls[0]["id"] != calls[1]["id"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert out["messages"][2]["tool_call_id"] == calls[1]["id"]  # matched by tool_name, not order
    assert out["messages"][3]["tool_call_id"] == calls[0]["id"]
    assert (out["top_k"], out["min_p"], out["repetition_penalty"], out["repeat_penalty"], out["typical_p"]) == (
        20,
        0.05,
        1.1,
        1.1,
        0.9,
    )
    assert "num_ctx" not in out and out["chat_template_kwargs"] == {"enable_thinking": True}
    thinking = json.loads(request_to_openai("chat", {"think": "high", "messages": []}, "b", False))
    assert thinking["reasoning_effort"] == "high"


def test_tool_calls_and_reasoning_come_back_in_ollama_shape():
    data = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": None,
                    "reasoning_content": "hmm",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 80, "completion_tokens": 10},
    }
    out = response_to_ollama("chat", data, "m", 2_000_000)
    assert out["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]
    assert out["message"]["thinking"] == "hmm"
    assert out["prompt_eval_duration"] + out["eval_duration"] == 2_000_000 and out["eval_duration"] > 0
    conv = SseToNdjson("chat", "m", 0.0)
    pieces = [
        {"reasoning_content": "th"},
        {"tool_calls": [{"index": 0, "id": "c9", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
    ]
    out_lines = [conv.line(b"data: " + json.dumps({"choices": [{"delta": d}]}).encode()) for d in pieces]
    assert json.loads(out_lines[0])["message"]["thinking"] == "th"
    tail = conv.line(b"data: [DONE]").splitlines()
    call = json.loads(tail[0])["message"]["tool_calls"][0]
    assert call["function"] == {"index": 0, "name": "f", "arguments": {"a": 1}} and call["id"] == "c9"
    assert json.loads(tail[1])["done"] is True


@pytest.fixture
async def openai_backend():
    async with run_mock(ttft_ms=50.0, tok_ms=2.0, tokens=8, models=["llama3"]) as m:
        async with run_router({"endpoints": [{"url": m.url, "name": "oa", "type": "openai"}]}) as r:
            yield r


async def test_translated_tool_call_parses_in_the_ollama_client(openai_backend, clients):
    client = clients.ollama(openai_backend.url)
    ask = dict(model="llama3", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER])
    out = await client.chat(**ask, stream=False)
    args = out.message.tool_calls[0].function.arguments
    assert out.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(args, dict) and isinstance(args["days"], int)
    calls = []
    async for part in await client.chat(**ask, stream=True):
        calls += part.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.arguments == args
    history = ask["messages"] + [
        out.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    final = await client.chat(model="llama3", messages=history, tools=[WEATHER], stream=False)
    assert final.message.content and not final.message.tool_calls


async def test_translated_answers_carry_durations(openai_backend, clients):
    client = clients.ollama(openai_backend.url)
    whole = await client.generate(model="llama3", prompt="hi", stream=False)
    assert whole.eval_count == 8 and whole.eval_duration > 0 and whole.prompt_eval_duration >= 0
    assert whole.total_duration >= 50_000_000  # the mock's 50 ms before the first token
    parts = [
        p async for p in await client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=True)
    ]
    last = parts[-1]
    assert last.done and last.eval_count == 8 and last.eval_duration > 0
    assert last.prompt_eval_duration >= 50_000_000  # time to the first token, which the mock delays
    assert last.total_duration == last.prompt_eval_duration + last.eval_duration
