"""Translation against a real OpenAI-only server (llama-cpp-python 0.3.36 from
`../shared/real-backends`): Ollama-API calls with tools, tool-call history, think and the
sampling options vLLM/llama.cpp accept are accepted (no validation error), stream and not,
with counts and durations filled. Skipped, with the reason, where it is absent."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from test import real_backends
from test.helpers import run_router

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
    },
}
HISTORY = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
]
OPTIONS = {
    "num_predict": 4,
    "top_k": 20,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "typical_p": 0.9,
    "seed": 1,
    "num_ctx": 4096,
}


@pytest.fixture(scope="module")
def llamacpp_url() -> Iterator[str]:
    real_backends.require("no real OpenAI-only server to translate to")
    url, pid = real_backends.start("start-llamacpp.sh", timeout=600)
    try:
        yield url
    finally:
        os.kill(pid, 15)


@pytest.mark.parametrize("model", ["tiny-oa", "tiny-oa-tools"])
async def test_tool_history_options_and_think_are_accepted(llamacpp_url, clients, model):
    async with run_router({"endpoints": [{"url": llamacpp_url, "name": "oa"}]}) as r:
        client = clients.ollama(r.url)
        whole = await client.chat(
            model=model, messages=HISTORY, tools=[WEATHER], think=False, options=OPTIONS, stream=False
        )
        assert whole.done_reason == "length" and whole.eval_count >= 4  # num_predict reached (llama-cpp counts 4 or 5)
        assert whole.eval_duration > 0 and whole.total_duration >= whole.eval_duration
        parts = [
            p
            async for p in await client.chat(
                model=model, messages=HISTORY, tools=[WEATHER], options=OPTIONS, stream=True
            )
        ]
        last = parts[-1]
        assert last.done and last.eval_count > 0 and last.eval_duration > 0 and last.prompt_eval_duration > 0
        assert len(parts) >= 2 and not any(p.done for p in parts[:-1])
        gen = await client.generate(model=model, prompt="hi", options=OPTIONS, stream=False)
        assert gen.done_reason == "length" and gen.eval_count >= 4
