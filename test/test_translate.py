"""Ollama -> OpenAI request mapping and OpenAI -> Ollama response mapping."""

from __future__ import annotations

import json

from nomyo_router.backends.translate import SseToNdjson, request_to_openai, response_to_ollama


def test_options_and_format_map_to_openai_fields():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "images": ["QUJD"]}],
        "options": {"num_predict": 7, "temperature": 0.2, "top_p": 0.9, "stop": ["\n"], "seed": 42},
        "format": "json",
    }
    out = json.loads(request_to_openai("chat", body, "backend-name", stream=True))
    assert out["model"] == "backend-name" and out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert (out["max_tokens"], out["temperature"], out["top_p"], out["stop"], out["seed"]) == (7, 0.2, 0.9, ["\n"], 42)
    assert out["response_format"] == {"type": "json_object"}
    parts = out["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "hi"} and parts[1]["image_url"]["url"].endswith("QUJD")
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    out = json.loads(
        request_to_openai(
            "generate",
            {"prompt": "p", "system": "s", "format": schema, "options": {"num_predict": -1}},
            "m",
            stream=False,
        )
    )
    assert out["prompt"] == "s\n\np" and "max_tokens" not in out
    assert out["response_format"]["json_schema"]["schema"] == schema


def test_usage_maps_back_to_ollama_counts():
    data = {
        "choices": [{"message": {"content": "yo"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
    }
    out = response_to_ollama("chat", data, "llama3", 1000)
    assert out["message"]["content"] == "yo" and out["done"] is True and out["done_reason"] == "length"
    assert (out["prompt_eval_count"], out["eval_count"], out["total_duration"]) == (5, 2, 1000)


def test_sse_stream_becomes_ndjson_with_a_done_chunk():
    conv = SseToNdjson("chat", "llama3", 0.0)
    lines = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n',
        b'data: {"choices":[{"delta":{"content":"he"}}]}\n',
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n',
        b"data: [DONE]\n",
    ]
    out = [json.loads(o) for o in (conv.line(line) for line in lines) if o]
    assert [o["message"]["content"] for o in out] == ["he", ""]
    assert out[-1]["done"] is True and out[-1]["eval_count"] == 1 and out[-1]["prompt_eval_count"] == 3
    assert conv.final() is None  # the done chunk is sent once
