"""One meaning per body (nomyo_router/api/body_keys.py): a JSON body a backend could read
otherwise than the router — a top-level key twice, a key spelt in another case (Go's
encoding/json, i.e. Ollama, matches keys to fields case-insensitively, the last one winning) —
is a 400 in the caller's shape, naming the key, and never reaches a backend; legitimate bodies,
the official clients' among them, still pass. Through a real router on sockets, with a client
key allowed only `llama3` and mocks that also serve SECRET (test/body_keys_router.py).
Multipart bodies: test_body_keys_multipart.py; the parse itself: test_body_keys_parse.py."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import ollama
import openai
import pytest

from nomyo_router.api.requests import GENERATION_ROUTES
from test.body_keys_router import ALLOWED, AUTH, KEY, MSGS, SECRET, assert_refused, limited_router, post

STREAMS = {"/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
BASE: dict[str, dict[str, Any]] = {  # a legitimate body per route, with the allowed model
    "/api/chat": {"model": ALLOWED, "messages": MSGS, "options": {"num_predict": 2}},
    "/api/generate": {"model": ALLOWED, "prompt": "hi", "options": {"num_predict": 2}},
    "/api/embed": {"model": ALLOWED, "input": "hi"},
    "/api/embeddings": {"model": ALLOWED, "prompt": "hi"},
    "/v1/chat/completions": {"model": ALLOWED, "messages": MSGS, "max_tokens": 2},
    "/v1/completions": {"model": ALLOWED, "prompt": "hi", "max_tokens": 2},
    "/v1/embeddings": {"model": ALLOWED, "input": "hi"},
    "/v1/messages": {"model": ALLOWED, "max_tokens": 2, "messages": MSGS},
    "/v1/responses": {"model": ALLOWED, "input": "hi", "max_output_tokens": 16},
    "/v1/rerank": {"model": ALLOWED, "query": "q", "documents": ["a", "b"]},
    "/rerank": {"model": ALLOWED, "query": "q", "documents": ["a", "b"]},
    "/v1/images/generations": {"model": ALLOWED, "prompt": "a cat"},
}
JSON_ROUTES = [p for p, (_, kind) in GENERATION_ROUTES.items() if kind != "transcription"]
# (JSON text of a member added to the body, the key as the router reads it, where: end or start)
BYPASSES = [
    (f'"Model": "{SECRET}"', "Model", "end"),
    (f'"Model": "{SECRET}"', "Model", "start"),
    (f'"MODEL": "{SECRET}"', "MODEL", "end"),
    (f'"\\u004dodel": "{SECRET}"', "Model", "end"),  # Model, escaped
    (f'"model": "{SECRET}"', "model", "end"),  # a second model
    (f'"mod\\u0065l": "{SECRET}"', "model", "end"),  # a second model, escaped
    (f'"model": "{SECRET}"', "model", "start"),  # the first of two
    ('"\u017ftream": true', "\u017ftream", "end"),  # stream with the long s (folds to s)
    ('"\\u017ftream": false', "\u017ftream", "end"),
    ('"\u212aeep_alive": 0', "\u212aeep_alive", "end"),  # keep_alive with the Kelvin sign (folds to k)
    ('"STREAM": true', "STREAM", "end"),
    ('"Messages": []', "Messages", "end"),
    ('"foo": 1, "FOO": 2', "FOO", "end"),  # two keys alike under folding
]


def with_member(body: dict[str, Any], member: str, where: str) -> bytes:
    text = json.dumps(body, ensure_ascii=False)
    text = "{" + member + ", " + text[1:] if where == "start" else text[:-1] + ", " + member + "}"
    return text.encode()


@pytest.fixture
async def router():
    async with limited_router() as r:
        yield r


async def test_every_bypass_on_every_generation_route_is_refused_before_any_backend(router):
    url, seen = router
    assert set(JSON_ROUTES) == set(BASE)  # a new route needs a body here
    async with aiohttp.ClientSession() as s:
        for path in JSON_ROUTES:
            for stream in (True, False) if path in STREAMS else (None,):
                base = BASE[path] if stream is None else {**BASE[path], "stream": stream}
                for member, key, where in BYPASSES:
                    status, body = await post(s, url + path, with_member(base, member, where))
                    assert_refused(path, status, body, key)
        # the same key given twice in plain JSON, the secret first and last
        for path in JSON_ROUTES:
            for first, last in ((ALLOWED, SECRET), (SECRET, ALLOWED)):
                raw = json.dumps(BASE[path])[:-1].replace(f'"model": "{ALLOWED}"', f'"model": "{first}"')
                status, body = await post(s, url + path, (raw + f', "model": "{last}"}}').encode())
                assert_refused(path, status, body, "model")
    assert seen == []


async def test_show_with_two_names_or_a_case_variant_is_refused(router):
    url, seen = router
    async with aiohttp.ClientSession() as s:
        for raw, key in (
            (b'{"model": "llama3", "Model": "qwen2.5:7b"}', "Model"),
            (b'{"Model": "qwen2.5:7b", "model": "llama3"}', "Model"),
            (b'{"model": "llama3", "\\u004eame": "qwen2.5:7b"}', "Name"),
            (b'{"model": "llama3", "NAME": "qwen2.5:7b"}', "NAME"),
            (b'{"model": "llama3", "model": "qwen2.5:7b"}', "model"),
            (b'{"name": "llama3", "name": "qwen2.5:7b"}', "name"),
            (b'{"model": "llama3", "name": "qwen2.5:7b"}', "name"),
            (b'{"name": "llama3", "model": "qwen2.5:7b"}', "name"),
            (b'{"model": "llama3", "verbose": true, "VERBOSE": false}', "VERBOSE"),
        ):
            status, body = await post(s, url + "/api/show", raw)
            assert status == 400 and isinstance(body["error"], str), (raw, status, body)
            assert f'"{key}"' in body["error"] or f"`{key}`" in body["error"], body
        # what Ollama's own CLI sends: both fields, one empty
        for raw in (
            b'{"model": "", "system": "", "template": "", "verbose": false, "options": null, "name": "llama3"}',
            b'{"model": "llama3", "system": "", "template": "", "verbose": false, "options": null, "name": ""}',
        ):
            status, body = await post(s, url + "/api/show", raw)
            assert status == 200 and "modelfile" in body
    assert seen == ["/api/show", "/api/show"]


async def test_legitimate_bodies_still_pass(router):
    url, seen = router
    tool = {
        "type": "function",
        "function": {
            "name": "run_model",
            "description": "Run a model",
            "parameters": {
                "type": "object",
                "required": ["model"],
                "properties": {"model": {"type": "string"}, "Model": {"type": "string"}, "stream": {"type": "boolean"}},
            },
        },
    }
    nested = {"metadata": {"model": SECRET, "Model": SECRET, "MODEL": 1}}  # nested keys are not the body's
    prompt = 'Почему небо голубое? 为什么天空是蓝色的？ \U0001f308 "model": "x" ſ K'
    async with aiohttp.ClientSession() as s:
        n = 0
        for path in JSON_ROUTES:
            for stream in (True, False) if path in STREAMS else (None,):
                base = BASE[path] if stream is None else {**BASE[path], "stream": stream}
                extra: dict[str, Any] = {}
                if path in ("/api/chat", "/v1/chat/completions", "/v1/messages"):
                    extra = {"messages": [{"role": "user", "content": prompt}], "tools": [tool]}
                elif "prompt" in base:
                    extra = {"prompt": prompt}
                for ascii_only in (True, False):  # non-ASCII escaped as \uXXXX, or as UTF-8
                    raw = json.dumps({**base, **extra, **nested}, ensure_ascii=ascii_only).encode()
                    status, body = await post(s, url + path, raw)
                    assert status == 200, (path, status, body)
                    n += 1
        assert len(seen) == n
        # compact and spaced JSON, keys in any order
        for raw in (
            b'{"messages":[{"role":"user","content":"hi"}],"model":"llama3","stream":false}',
            b' {\n  "model" : "llama3" ,\n  "stream" : false ,\n  "messages" : [ ]\n} \n',
        ):
            status, body = await post(s, url + "/api/chat", raw)
            assert status == 200, body
        # the official clients (the transcription's multipart body as httpx writes it)
        ol = ollama.AsyncClient(host=url, headers=AUTH)
        oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        try:
            assert (await ol.chat(model=ALLOWED, messages=MSGS, stream=False)).message.content
            assert (await ol.show(ALLOWED)).modelfile is not None
            assert (await oa.chat.completions.create(model=ALLOWED, messages=MSGS)).choices[0].message.content
            text = await oa.audio.transcriptions.create(
                model=ALLOWED, file=("talk.wav", b"RIFF\x00\x01", "audio/wav"), language="en", prompt="a talk"
            )
            assert text.text.startswith("mock transcription")
        finally:
            await ol.close()
            await oa.close()
    assert len(seen) == n + 6
