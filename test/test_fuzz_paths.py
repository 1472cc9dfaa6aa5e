"""Property-based fuzzing (hypothesis) of the paths that read a request's body beyond its
shape: the `moe-` ensemble, trim-and-retry, the response cache and context-window routing.
Whatever the body, the router itself never answers 5xx (a backend's 5xx, passed through,
carries `X-Router-Endpoint`), and no slot or queue place is left behind."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mock import run_mock
from test.conftest import FAST
from test.test_fuzz import message, router_over_two_mocks, values

ROUTES = ["/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages"]
# content parts, well formed or not: text of any type, images, unknown types
part = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["text", "image_url", "input_audio", "tool_result"]) | values,
        "text": st.text(max_size=8) | values,
        "image_url": st.just({"url": "data:image/png;base64,AAAA"}) | values,
    },
)
chat_message = message | st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": st.lists(part, max_size=3)}
)
# well-formed turns with odd parts, so that bodies reach the cache, the ensemble and trimming
turn = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system", "tool"]),
        "content": st.text(max_size=12) | st.lists(part, max_size=2),
    },
    optional={"images": st.lists(st.sampled_from(["AAAA", "BBBB"]), max_size=1), "tool_calls": values},
)
cacheable = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["llama3", "gpt-mock", "moe-llama3"]),
        "messages": st.lists(turn, min_size=1, max_size=4),
        "nomyo": st.just({"cache": True}),
    },
    optional={"stream": st.booleans(), "prompt": st.text(max_size=12), "options": values, "seed": values},
)
body = cacheable | st.fixed_dictionaries(
    {"model": st.sampled_from(["moe-llama3", "llama3", "moe-gpt-mock", "moe-", "moe-nope"]) | values},
    optional={
        "messages": st.lists(chat_message, max_size=4) | values,
        "prompt": st.text(max_size=12) | values,
        "stream": st.booleans(),
        "nomyo": st.just({"cache": True}) | values,
        "options": values,
        "max_tokens": st.integers(-5, 10**9) | values,
        "images": values,
        "tools": values,
        "seed": values,
        "stream_options": values,
    },
)


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[str, int]]:
    """A router with every body-reading path on (ensembles, trim, the cache, context routing)."""
    config = {
        "context_overflow": "trim",
        "context_routing": "reject",
        "cache": {"enabled": True, "similarity": 0.9, "embed_model": "llama3"},  # (semantic mode)
        "moe": {"samples": 2},
    }
    with router_over_two_mocks(config) as (host, port, _):
        yield host, port


EXAMPLES = int(os.environ.get("NOMYO_FUZZ_EXAMPLES", "0")) or None


@settings(
    max_examples=EXAMPLES or 150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(ROUTES), data=body)
def test_no_body_makes_an_ensemble_trim_cache_or_context_routing_fail(router, path: str, data: Any) -> None:
    host, port = router
    conn = http.client.HTTPConnection(host, port, timeout=15)
    try:
        conn.request("POST", path, body=json.dumps(data), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    # 501: a route no endpoint of that model's type serves (an OpenAI-type backend and /v1/messages)
    ok = resp.status < 500 or resp.status == 501 or resp.getheader("X-Router-Endpoint") is not None
    assert ok, (resp.status, path, data)


def test_an_image_part_whose_text_is_not_a_string_is_a_400(router) -> None:
    """The ensemble read a part's `text` as a string: a number, null or object there was a 500."""
    host, port = router
    for text in (5, None, {"a": 1}):
        part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "text": text}
        data = {"model": "moe-llama3", "messages": [{"role": "user", "content": [part]}]}
        conn = http.client.HTTPConnection(host, port, timeout=15)
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(data), headers=headers)
        resp = conn.getresponse()
        error = json.loads(resp.read())["error"]
        conn.close()
        assert resp.status == 400 and error["param"] == "messages[0].content[0].text", error


def test_after_fuzzing_no_slot_or_queue_place_is_left(router) -> None:
    host, port = router
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/health")
    health = json.loads(conn.getresponse().read())
    assert health["queue_length"] == 0
    assert all(e["in_flight"] == 0 for e in health["endpoints"]), health["endpoints"]
    conn.request("GET", "/api/cache/stats")
    stats = json.loads(conn.getresponse().read())
    assert stats["mode"] == "semantic" and stats["misses"] > 0  # (the cache's path was fuzzed too)


async def test_the_mock_answers_a_malformed_body_400_as_a_server_does():
    """Not 500: a body of the wrong shape is the client's fault (the router's fuzzing tells a
    backend's 5xx apart, so a mock that failed on such bodies would hide the router's own)."""
    import aiohttp

    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "text": 5}
    bodies = [
        ("/v1/chat/completions", {"model": "llama3", "messages": [{"role": "user", "content": [part]}]}),
        ("/v1/chat/completions", {"model": "llama3", "messages": [{"role": "user", "content": [5]}]}),
        ("/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": [{"text": None}]}]}),
        ("/api/chat", {"model": "llama3", "messages": [{"role": "user", "content": {"a": 1}}]}),
        ("/api/chat", {"model": "llama3", "messages": [None, {"role": 5, "content": {}}]}),
    ]
    async with run_mock(**FAST) as m, aiohttp.ClientSession() as s:
        for path, data in bodies:
            async with s.post(m.url + path, json=data) as resp:
                assert resp.status == 400, (path, data, await resp.text())
