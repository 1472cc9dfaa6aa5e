"""Trim-and-retry on context overflow, on real sockets: a small backend that refuses histories
longer than its context, in the forms vLLM (current and older), OpenAI, llama.cpp and Ollama
use, and counts what it was asked."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from mock import free_port
from test.helpers import run_router

LIMIT = 1200  # characters of messages the backend's context holds (4 per token)


def history(turns: int = 10) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        msgs += [
            {"role": "user", "content": f"question {i} " + "x" * 150},
            {"role": "assistant", "content": f"answer {i} " + "y" * 150},
        ]
    return msgs + [{"role": "user", "content": "and the last question?"}]


class Refusing:
    """Refuses (400) a chat whose messages are longer than `limit` characters, in `style`."""

    def __init__(self, style: str, limit: int = LIMIT) -> None:
        self.style, self.limit = style, limit
        self.seen: list[list[dict[str, Any]]] = []

    def refusal(self, used: int) -> dict[str, Any]:
        lt, ut = self.limit // 4, used // 4
        return {
            "openai": {
                "error": {
                    "message": f"This model's maximum context length is {lt} tokens. However, your "
                    f"messages resulted in {ut} tokens. Please reduce the length of the "
                    "messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
            "vllm-old": {
                "object": "error",
                "message": f"This model's maximum context length is {lt} tokens. However, "
                f"you requested {ut} tokens ({ut} in the messages, 0 in the "
                "completion). Please reduce the length of the messages or "
                "completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
            "llamacpp": {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": ut,
                    "n_ctx": lt,
                }
            },
            "ollama": {"error": "the input length exceeds the context length"},
            "other": {
                "error": {
                    "message": "temperature must be between 0 and 2",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": None,
                }
            },
        }[self.style]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        msgs = body["messages"]
        self.seen.append(msgs)
        used = sum(len(m.get("content") or "") for m in msgs)
        if used > self.limit or self.style == "other":
            return web.json_response(self.refusal(used), status=400)
        text = f"I read {len(msgs)} messages."
        ollama = request.path == "/api/chat"
        if not body.get("stream", ollama):
            if ollama:
                return web.json_response(
                    {
                        "model": body["model"],
                        "created_at": "2025-01-01T00:00:00Z",
                        "message": {"role": "assistant", "content": text},
                        "done": True,
                        "done_reason": "stop",
                        "prompt_eval_count": used // 4,
                        "eval_count": 5,
                    }
                )
            return web.json_response(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": used // 4, "completion_tokens": 5, "total_tokens": 9},
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson" if ollama else "text/event-stream"})
        await resp.prepare(request)
        if ollama:
            await resp.write(
                json.dumps(
                    {"model": body["model"], "message": {"role": "assistant", "content": text}, "done": False}
                ).encode()
                + b"\n"
            )
            await resp.write(
                json.dumps(
                    {
                        "model": body["model"],
                        "message": {"role": "assistant", "content": ""},
                        "done": True,
                        "done_reason": "stop",
                        "eval_count": 5,
                    }
                ).encode()
                + b"\n"
            )
        else:
            chunk = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}],
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
        return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "llama3"}]})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.12.0"})


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": "llama3:latest", "model": "llama3:latest"}]})


@contextlib.asynccontextmanager
async def refusing(style: str, limit: int = LIMIT) -> AsyncIterator[tuple[Refusing, str]]:
    b = Refusing(style, limit)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", b.chat)
    app.router.add_post("/api/chat", b.chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", tags)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield b, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def config(url: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"endpoints": [{"url": url, "name": "b", "type": kind, "models": ["llama3"]}], **extra}


@pytest.mark.parametrize("style", ["openai", "vllm-old", "llamacpp"])
@pytest.mark.parametrize("stream", [False, True])
async def test_the_oldest_turns_go_until_the_backend_accepts(style, stream):
    async with refusing(style) as (b, url):
        async with run_router(config(url, "openai", context_overflow="trim")) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                msgs = history()
                resp = await c.post(
                    r.url + "/v1/chat/completions", json={"model": "llama3", "messages": msgs, "stream": stream}
                )
    assert resp.status_code == 200, resp.text
    kept = b.seen[-1]
    assert kept[0] == msgs[0] and kept[-1] == msgs[-1]  # the system message and the last user turn
    assert kept[1]["role"] == "user"  # whole turns went: an answer never loses its question
    assert kept == [msgs[0], *msgs[len(msgs) - len(kept) + 1 :]]  # the newest turns stayed, in order
    assert int(resp.headers["X-Router-Trimmed"]) == len(msgs) - len(kept)
    assert len(b.seen) == 2  # the error said how much was too much: one retry dropped enough
    assert sum(len(m["content"]) for m in kept) > LIMIT / 2  # ... and not much more than that


async def test_ollama_without_numbers_halves_the_history_then_keeps_only_what_must_stay():
    async with refusing("ollama", limit=700) as (b, url):
        async with run_router(config(url, "ollama", context_overflow="trim")) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                async with c.stream(
                    "POST", r.url + "/api/chat", json={"model": "llama3", "messages": history(16)}
                ) as resp:
                    lines = [json.loads(x) async for x in resp.aiter_lines() if x.strip()]
    assert resp.status_code == 200 and lines[-1]["done"] is True
    # 16 turns, then 8 (+ system + last); the third ask is the last max_attempts allows: every
    # droppable turn goes, so it is answered
    assert [len(s) for s in b.seen] == [34, 18, 2]
    assert resp.headers["X-Router-Trimmed"] == "32"


async def test_re_asks_are_bounded_by_max_attempts_and_count_on_the_key_s_rpm():
    async with refusing("ollama", limit=700) as (b, url):
        async with run_router(config(url, "ollama", context_overflow="trim", max_attempts=2)) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                body = {"model": "llama3", "messages": history(16), "stream": False}
                resp = await c.post(r.url + "/api/chat", json=body)
    assert resp.status_code == 200 and [len(s) for s in b.seen] == [34, 2]  # two asks in all
    keys = [{"name": "k", "key": "k-key-123456", "rpm": 2}]
    async with refusing("ollama", limit=700) as (b, url):
        async with run_router(config(url, "ollama", context_overflow="trim", client_keys=keys)) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                resp = await c.post(r.url + "/api/chat", json=body, headers={"Authorization": "Bearer k-key-123456"})
    # the request and its first re-ask are the key's two requests of the minute; the next is refused
    assert resp.status_code == 429 and "rate limit" in resp.json()["error"]
    assert [len(s) for s in b.seen] == [34, 18]


async def test_another_400_and_the_default_pass_the_answer_through_untouched():
    async with refusing("other") as (b, url):
        async with run_router(config(url, "openai", context_overflow="trim")) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                resp = await c.post(r.url + "/v1/chat/completions", json={"model": "llama3", "messages": history()})
    assert resp.status_code == 400 and resp.json() == b.refusal(0) and len(b.seen) == 1
    assert "X-Router-Trimmed" not in resp.headers
    async with refusing("openai") as (b, url):
        async with run_router(config(url, "openai")) as r:  # context_overflow: off (the default)
            async with httpx.AsyncClient(timeout=10) as c:
                resp = await c.post(r.url + "/v1/chat/completions", json={"model": "llama3", "messages": history()})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    assert len(b.seen) == 1


async def test_when_nothing_more_can_go_the_refusal_stands():
    async with refusing("openai") as (b, url):
        async with run_router(config(url, "openai", context_overflow="trim")) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "z" * 5000}]
                resp = await c.post(r.url + "/v1/chat/completions", json={"model": "llama3", "messages": msgs})
                assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
                assert len(b.seen) == 1 and "X-Router-Trimmed" not in resp.headers
                # a history whose last turn alone is too long: trimmed to it, then refused, saying so
                msgs = history(4)[:-1] + [{"role": "user", "content": "z" * 5000}]
                resp = await c.post(r.url + "/v1/chat/completions", json={"model": "llama3", "messages": msgs})
    assert resp.status_code == 400 and resp.headers["X-Router-Trimmed"] == "8"
    assert [m["role"] for m in b.seen[-1]] == ["system", "user"]


async def test_tool_results_go_with_the_turn_that_called_them():
    msgs = [{"role": "system", "content": "s"}]
    for i in range(6):
        msgs += [
            {"role": "user", "content": f"q{i} " + "x" * 150},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"call{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": f"call{i}", "content": "r" * 150},
            {"role": "assistant", "content": "a" * 100},
        ]
    msgs.append({"role": "user", "content": "last"})
    async with refusing("ollama", limit=900) as (b, url):
        async with run_router(config(url, "openai", context_overflow="trim")) as r:
            async with httpx.AsyncClient(timeout=10) as c:
                resp = await c.post(r.url + "/v1/chat/completions", json={"model": "llama3", "messages": msgs})
    assert resp.status_code == 200
    for sent in b.seen[1:]:
        assert sent[1]["role"] == "user" and (len(sent) - 2) % 4 == 0


@pytest.mark.parametrize(
    "body, limit, used",
    [
        (
            b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, you requested 5000 tokens '  # noqa: E501 (a backend's words, verbatim)
            b'(4000 in the messages, 1000 in the completion).","code":"context_length_exceeded"}}',
            4096,
            5000,
        ),
        (
            b'{"object":"error","message":"This model\'s maximum context length is 2048 tokens. However, you requested 3000 '  # noqa: E501 (a backend's words, verbatim)
            b'tokens (3000 in the messages, 0 in the completion)."}',
            2048,
            3000,
        ),
        (
            b'{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it",'
            b'"type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}',
            8192,
            9000,
        ),
        (
            b'{"error":{"code":400,"message":"request (9000 tokens) exceeds the available context size (8192 tokens), try '  # noqa: E501 (a backend's words, verbatim)
            b'increasing it","type":"exceed_context_size_error"}}',
            8192,
            9000,
        ),
        (b'{"error":"the input length exceeds the context length"}', None, None),
        (
            b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 '  # noqa: E501 (a backend's words, verbatim)
            b'maximum"}}',
            None,
            None,
        ),
    ],
)
def test_every_server_s_overflow_is_recognised_and_its_numbers_read(body, limit, used):
    from nomyo_router.forward import overflow

    assert overflow.is_overflow(body)
    got_limit, got_used = overflow._LIMIT.search(body), overflow._USED.search(body)
    assert (int(got_limit.group(1)) if got_limit else None) == limit
    assert (int(got_used.group(1)) if got_used else None) == used


@pytest.mark.parametrize(
    "body",
    [
        b'{"error":{"message":"temperature must be between 0 and 2","type":"invalid_request_error"}}',
        b'{"error":"model \'x\' not found"}',
        b'{"error":{"message":"max_tokens must be at least 1"}}',
    ],
)
def test_other_refusals_are_not_overflows(body):
    from nomyo_router.forward import overflow

    assert not overflow.is_overflow(body)
