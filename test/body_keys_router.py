"""The router the body-key tests send their bodies to: a client key allowed only `ALLOWED`,
and two mocks serving both `ALLOWED` and `SECRET` that record every POST they receive, so a
test can tell that a refused body never reached a backend; and how a refusal must look."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from mock import http as web
from mock import run_mock
from test.conftest import FAST
from test.helpers import run_router

KEY = "limited-key-0123456789"
ALLOWED, SECRET = "llama3", "qwen2.5:7b"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "hi"}]


def shape_of(path: str) -> str:
    """The API whose error shape the router answers in (as app.py picks it)."""
    return ("anthropic" if path.startswith("/v1/messages") else "openai") if path.startswith("/v1/") else "ollama"


def assert_refused(path: str, status: int, body: Any, key: str) -> None:
    """400 in `path`'s shape, the message quoting `key`."""
    assert status == 400, (path, key, status, body)
    shape = shape_of(path)
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    elif shape == "openai":
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == key, body
        message = body["error"]["message"]
    else:
        assert isinstance(body["error"], str)
        message = body["error"]
    assert json.dumps(key, ensure_ascii=False) in message or f'"{key}"' in message, (key, message)


def record(*mocks: Any) -> list[str]:
    """The POSTs the mocks receive (every route handler wrapped); /v1/messages served too."""
    seen: list[str] = []
    for m in mocks:
        routes = m.backend.routes
        routes[("POST", "/v1/messages")] = _anthropic_stub
        for route, handler in list(routes.items()):
            if route[0] == "POST":

                async def wrapped(request: Any, handler: Any = handler, path: str = route[1]) -> Any:
                    seen.append(path)
                    return await handler(request)

                routes[route] = wrapped
    return seen


async def _anthropic_stub(request: Any) -> Any:
    body = json.loads(request.body)
    return web.Response(
        200,
        json.dumps(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": "hi"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        ).encode(),
    )


@asynccontextmanager
async def limited_router() -> AsyncIterator[tuple[str, list[str]]]:
    """(router url, what the backends received): a an Ollama-type mock, b an OpenAI-type one
    (rerank goes there), both serving ALLOWED and SECRET; the key may use only ALLOWED."""
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        seen = record(a, b)
        eps = [{"url": a.url, "name": "a"}, {"url": b.url, "name": "b", "type": "openai"}]
        # (context_routing off: learning the backends' context windows would POST /api/show itself)
        async with run_router(
            {
                "endpoints": eps,
                "context_routing": "off",
                "client_keys": [{"name": "app", "key": KEY, "models": [ALLOWED]}],
            }
        ) as r:
            yield r.url, seen


async def post(s: aiohttp.ClientSession, url: str, raw: bytes, ctype: str = "application/json") -> tuple[int, Any]:
    async with s.post(url, data=raw, headers={**AUTH, "Content-Type": ctype}) as resp:
        text = await resp.read()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
