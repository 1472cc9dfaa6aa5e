"""Property-based fuzzing of every route (hypothesis): whatever a client sends, the router
itself never answers 5xx, and no slot or queue place leaks. A 5xx that a backend sent is
told apart by the `X-Router-Endpoint` header (the router passes backend answers through)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mock import run_mock
from test.conftest import FAST
from test.helpers import run_router

POST_ROUTES = [
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/api/show",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/api/pull",
    "/api/create",
    "/api/copy",
    "/api/blobs/sha256:" + "0" * 64,
    "/v1/responses",
    "/v1/rerank",
    "/rerank",
    "/v1/images/generations",
    "/v1/audio/transcriptions",
]
GET_ROUTES = ["/api/tags", "/api/ps", "/api/version", "/v1/models", "/health", "/", "/nope"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "a\x00b", "llama3", "gpt-mock", ""])
)
values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "tool"]) | values,
        "content": st.text(max_size=20) | values,
        "images": values,
        "tool_calls": values,
    },
)
body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["llama3", "gpt-mock", "nope"]) | values,
        "messages": st.lists(message, max_size=3) | values,
        "prompt": st.text(max_size=20) | values,
        "input": values,
        "stream": st.booleans() | values,
        "options": values,
        "format": values,
        "tools": values,
        "max_tokens": values,
        "keep_alive": values,
        "think": values,
    },
)
deep = st.integers(60, 3000).map(lambda n: b'{"model":"llama3","messages":' + b"[" * n + b"]" * n + b"}")
raw_bodies = (
    body.map(lambda b: json.dumps(b).encode())
    | st.binary(max_size=64)
    | deep
    | st.sampled_from([b"", b"null", b"[]", b'{"model": "llama3", "prompt": "' + b"x" * 2000 + b'\\ud800"}'])
)


@contextlib.contextmanager
def router_over_two_mocks(extra: dict[str, Any]) -> Iterator[tuple[str, int, Any]]:
    """(host, port, running router) of a router over two mocks (one declared OpenAI-type, so
    translation is fuzzed too) with `extra` config, in its own thread and event loop while
    hypothesis drives it synchronously."""
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        async with run_mock(**FAST) as a, run_mock(**FAST, models=["gpt-mock"]) as b:
            eps = [
                {"url": a.url, "name": "a", "max_concurrent": 4},
                {"url": b.url, "name": "b", "type": "openai", "max_concurrent": 4},
            ]
            async with run_router({"endpoints": eps, "queue_timeout": 5, **extra}) as r:
                box["r"], box["loop"], box["stop"] = r, asyncio.get_running_loop(), asyncio.Event()
                ready.set()
                await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(30), "router did not start"
    try:
        yield "127.0.0.1", int(box["r"].url.rsplit(":", 1)[1]), box["r"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(15)


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[str, int, Any]]:
    with router_over_two_mocks({}) as running:
        yield running


def _call(host: str, port: int, method: str, path: str, data: bytes | None, ctype: str) -> tuple[int, bool]:
    conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data is not None else {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("X-Router-Endpoint") is not None
    finally:
        conn.close()


EXAMPLES = int(os.environ.get("NOMYO_FUZZ_EXAMPLES", "0")) or None  # e.g. 10000 for a long run


@settings(
    max_examples=EXAMPLES or 350,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(POST_ROUTES),
    data=raw_bodies,
    ctype=st.sampled_from(["application/json", "text/plain", "multipart/form-data", ""]),
)
def test_no_post_body_makes_the_router_fail(router, path: str, data: bytes, ctype: str) -> None:
    host, port, _ = router
    status, from_backend = _call(host, port, "POST", path, data, ctype)
    assert status < 500 or status == 501 or from_backend, (status, path, data[:120])  # 501: route not served


@settings(max_examples=EXAMPLES or 60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "POST"]),
    path=st.sampled_from(GET_ROUTES + POST_ROUTES) | st.text(alphabet="/abc%._~", max_size=12).map(lambda p: "/" + p),
)
def test_no_method_or_path_makes_the_router_fail(router, method: str, path: str) -> None:
    host, port, _ = router
    status, _ = _call(host, port, method, path, None, "")
    assert status < 500, (status, method, path)


header_lines = st.lists(
    st.sampled_from(
        [
            b"Content-Length: 5",
            b"Content-Length: 50",
            b"Content-Length: -1",
            b"Content-Length: 99999999999999999999",
            b"Transfer-Encoding: chunked",
            b"Transfer-Encoding: gzip, chunked",
            b"Transfer-Encoding: identity",
            b"Content-Length: 5\r\nContent-Length: 6",
            b"Connection: Upgrade",
            b"Upgrade: websocket",
            b"Upgrade: h2c",
            b"Expect: 100-continue",
            b"Content-Type: application/json",
            b"Host: a\x00b",
            b"X-Session-ID: \xff\xfe",
            b"Authorization: Bearer \x00",
            b"Origin: null",
            b"Origin: http://localhost:1",
        ]
    ),
    max_size=5,
)
raw_requests = st.builds(
    lambda method, path, headers, body: (
        method + b" " + path + b" HTTP/1.1\r\nHost: [::1]\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
    ),
    st.sampled_from([b"POST", b"GET", b"PUT", b"BREW", b"", b"POST POST"]),
    st.sampled_from([p.encode() for p in POST_ROUTES] + [b"/", b"*", b"/api/chat?x=%zz", b"//api//chat", b"/\x00"]),
    header_lines,
    st.sampled_from(
        [b"", b"hello", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", b'{"model":"llama3","messages":[]}', b"zz\r\n"]
    ),
)


@settings(max_examples=EXAMPLES or 150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=raw_requests)
def test_malformed_http_never_gets_a_5xx_from_the_router(router, data: bytes) -> None:
    host, port, _ = router
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # nothing more is coming: the router answers or closes
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    status_line = reply.split(b"\r\n", 1)[0]
    # An answer is a well-formed status line; closing without one is allowed for garbage, so
    # the router must then still serve the next client (a crash or a wedged loop fails here).
    assert not reply or re.fullmatch(rb"HTTP/1\.1 [1-5]\d\d( [^\r\n]*)?", status_line), (status_line, data[:200])
    if status_line.startswith(b"HTTP/1.1 5"):
        assert b"x-router-endpoint" in reply.lower(), (status_line, data[:200])
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/api/version")
    assert conn.getresponse().status == 200
    conn.close()


def test_after_fuzzing_no_slot_or_queue_place_is_left(router) -> None:
    host, port, _ = router
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    assert health["queue_length"] == 0
    assert all(e["in_flight"] == 0 for e in health["endpoints"]), health["endpoints"]


def test_a_websocket_upgrade_is_refused_cleanly(router) -> None:
    host, port, _ = router
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(
        "GET",
        "/api/chat",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert 400 <= conn.getresponse().status < 500
