"""Against a real Ollama (`../shared/real-backends`, v0.24, models `tiny` and `tiny2`): a client
key allowed only `tiny` never gets an answer from `tiny2`, whatever the body says twice.

First, on Ollama itself, that the attack is real: Go's encoding/json fills `model` from a key
spelt in any case (the last one winning), folds the long s and the Kelvin sign, and Ollama's
multipart reader takes the first `model` field, however its name is spelt. Then every bypass on
every generation path through the router: a 400, never tiny2's answer. One Ollama per module,
one or two tokens per generation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from test import real_backends
from test.helpers import run_router

KEY = "limited-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "hi"}]
BASE: dict[str, dict[str, Any]] = {  # a legitimate body per path, for `tiny`, one or two tokens
    "/api/chat": {"model": "tiny", "messages": MSGS, "options": {"num_predict": 1}},
    "/api/generate": {"model": "tiny", "prompt": "hi", "options": {"num_predict": 1}},
    "/api/embed": {"model": "tiny", "input": "hi"},
    "/api/embeddings": {"model": "tiny", "prompt": "hi"},
    "/v1/chat/completions": {"model": "tiny", "messages": MSGS, "max_tokens": 1},
    "/v1/completions": {"model": "tiny", "prompt": "hi", "max_tokens": 1},
    "/v1/embeddings": {"model": "tiny", "input": "hi"},
    "/v1/messages": {"model": "tiny", "max_tokens": 1, "messages": MSGS},
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 16},
    "/api/show": {"model": "tiny"},
}
STREAMS = {"/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}
# members added to a body: (JSON text, where) — each makes Go read tiny2, or a field other than the router's
MODEL_BYPASSES = [
    ('"Model": "tiny2"', "end"),
    ('"MODEL": "tiny2"', "end"),
    ('"\\u004dodel": "tiny2"', "end"),
    ('"mODEL": "tiny2"', "start"),
    ('"model": "tiny2"', "end"),  # a second model: Go and Python keep the last, other parsers the first
    ('"model": "tiny2"', "start"),
    ('"mod\\u0065l": "tiny2"', "end"),
]
FOLDED = {  # keys that Go folds onto another field: the long s (ſ -> s), the Kelvin sign (K -> k)
    "ollama": ['"optionſ": {"num_predict": 5}', '"\\u017ftream": true', '"\u212aeep_alive": 0'],
    "openai": ['"max_to\u212aens": 5', '"ſtream": true'],
    "anthropic": ['"max_to\\u212aens": 5', '"ſtream": true'],
}
CHATS = {
    "/api/chat": '"meſſages": [{"role": "user", "content": "other"}]',
    "/v1/chat/completions": '"meſſages": [{"role": "user", "content": "other"}]',
    "/v1/messages": '"me\\u017f\\u017fages": [{"role": "user", "content": "other"}]',
}
SHOW_BYPASSES = ['"name": "tiny2"', '"Name": "tiny2"', '"NAME": "tiny2"', '"\\u004eame": "tiny2"']


@pytest.fixture(scope="module")
def ollama_url() -> Iterator[str]:
    yield from real_backends.ollama_server("no real Ollama to attack")


def with_member(body: dict[str, Any], member: str, where: str = "end") -> bytes:
    text = json.dumps(body)
    return ("{" + member + ", " + text[1:] if where == "start" else text[:-1] + ", " + member + "}").encode()


def api_of(path: str) -> str:
    return ("anthropic" if path.startswith("/v1/messages") else "openai") if path.startswith("/v1/") else "ollama"


async def post(
    s: aiohttp.ClientSession, url: str, raw: bytes, ctype: str = "application/json", auth: bool = True
) -> tuple[int, bytes]:
    async with s.post(url, data=raw, headers={"Content-Type": ctype, **(AUTH if auth else {})}) as resp:
        return resp.status, await resp.read()


def form(*fields: tuple[bytes, bytes], boundary: bytes = b"b0undaryR3aLsEc") -> bytes:
    """A transcription's multipart body: (Content-Disposition parameters, value) per text field, then a file."""
    parts = [b"Content-Disposition: form-data; " + spelt + b"\r\n\r\n" + value for spelt, value in fields]
    parts.append(
        b'Content-Disposition: form-data; name="file"; filename="talk.wav"\r\nContent-Type: audio/wav'
        b"\r\n\r\nRIFF\x00\x00\x00\x00WAVE"
    )
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary + b"--\r\n"


MULTIPART = "multipart/form-data; boundary=b0undaryR3aLsEc"
MULTIPART_BYPASSES = [
    [(b'name="model"', b"tiny2"), (b'name="model"', b"tiny")],  # Ollama takes the first
    [(b'name="model"', b"tiny"), (b'name="model"', b"tiny2")],  # a naive reader, the last
    [(b"NAME=model", b"tiny2"), (b'name="model"', b"tiny")],  # Go lower-cases the parameter, unquoted value
    [(b"name=model", b"tiny2"), (b'name="model"', b"tiny")],
    [(b'Name="model"', b"tiny2"), (b'name="model"', b"tiny")],
    [(b'name="Model"', b"tiny2"), (b'name="model"', b"tiny")],
    [(b'name="model"; filename=""', b"tiny2"), (b'name="model"', b"tiny")],  # an empty filename: a value to Go
    [(b"name=\"prompt\"; name*=utf-8''model", b"tiny2"), (b'name="model"', b"tiny")],  # RFC 2231 name
]


async def test_ollama_itself_serves_tiny2_for_these_bodies(ollama_url):
    """The attack, straight to Ollama: what the router must never let through."""
    gen = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    async with aiohttp.ClientSession() as s:
        for member in ('"Model": "tiny2"', '"\\u004dodel": "tiny2"', '"model": "tiny2"'):
            status, body = await post(s, ollama_url + "/api/generate", with_member(gen, member), auth=False)
            assert status == 200 and json.loads(body)["model"] == "tiny2", (member, body)
        # folding: the long s and the Kelvin sign name other fields to Go
        status, body = await post(
            s,
            ollama_url + "/api/generate",
            with_member({**gen, "options": {"num_predict": 2}}, '"optionſ": {"num_predict": 4}'),
            auth=False,
        )
        assert status == 200 and json.loads(body)["eval_count"] == 4
        chat = {"model": "tiny", "messages": MSGS, "max_tokens": 1}
        status, body = await post(
            s, ollama_url + "/v1/chat/completions", with_member(chat, '"max_to\u212aens": 3'), auth=False
        )
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
        # multipart: the first model field, its name spelt any way Go's mime package accepts
        for first in (b'name="model"', b"NAME=model"):
            status, body = await post(
                s,
                ollama_url + "/v1/audio/transcriptions",
                form((first, b"no-such-model"), (b'name="model"', b"tiny")),
                MULTIPART,
                auth=False,
            )
            assert status == 404 and b"no-such-model" in body, body


async def test_no_bypass_gets_tiny2_through_the_router(ollama_url):
    cfg = {
        "endpoints": [{"url": ollama_url, "name": "real"}],
        "client_keys": [{"name": "app", "key": KEY, "models": ["tiny"]}],
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        tried = 0
        for path, base in BASE.items():
            for stream in (True, False) if path in STREAMS else (None,):
                body = base if stream is None else {**base, "stream": stream}
                # the key works for tiny and not for tiny2 on this path
                status, answer = await post(s, r.url + path, json.dumps(body).encode())
                assert status == 200 and b"tiny2" not in answer, (path, status, answer[:300])
                status, _ = await post(s, r.url + path, json.dumps({**body, "model": "tiny2"}).encode())
                assert status in (403, 404), (path, status)  # (/api/show: a model the key may not see is absent)
                members = [m for m in MODEL_BYPASSES] + [(m, "end") for m in FOLDED[api_of(path)]]
                members += [(CHATS[path], "end")] if path in CHATS else []
                members += [(m, "end") for m in SHOW_BYPASSES] if path == "/api/show" else []
                for member, where in members:
                    status, answer = await post(s, r.url + path, with_member(body, member, where))
                    assert status == 400 and b"tiny2" not in answer, (path, stream, member, status, answer[:300])
                    tried += 1
        path = "/v1/audio/transcriptions"
        for fields in MULTIPART_BYPASSES:
            status, answer = await post(s, r.url + path, form(*fields), MULTIPART)
            assert status == 400 and b"tiny2" not in answer, (fields, status, answer[:300])
            assert json.loads(answer)["error"]["type"] == "invalid_request_error"
            tried += 1
        status, _ = await post(s, r.url + path, form((b'name="model"', b"tiny2")), MULTIPART)
        assert status == 403
    assert tried > 150


async def test_a_limited_key_learns_nothing_of_tiny2(ollama_url):
    """Listings, /api/ps, /v1/models/{id} and /api/show, against the real Ollama: tiny2 is
    invisible to a key limited to tiny, and answers as an absent model would."""
    cfg = {
        "endpoints": [{"url": ollama_url, "name": "real"}],
        "client_keys": [{"name": "app", "key": KEY, "models": ["tiny"]}, {"name": "all", "key": "all-key-0123456789"}],
    }
    async with run_router(cfg) as r, aiohttp.ClientSession() as s:
        async with s.post(
            r.url + "/api/generate",
            json={"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
            headers=AUTH,
        ) as resp:
            assert resp.status == 200  # tiny is loaded: /api/ps has something to show
        async with s.post(
            r.url + "/api/generate",
            json={"model": "tiny2", "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
            headers={"Authorization": "Bearer all-key-0123456789"},
        ) as resp:
            assert resp.status == 200  # and so is tiny2, by a key that may
        for path in ("/api/tags", "/api/ps", "/v1/models"):
            async with s.get(r.url + path, headers=AUTH) as resp:
                text = await resp.text()
                assert resp.status == 200 and "tiny2" not in text, (path, text)
                assert path == "/api/ps" or "tiny" in text, (path, text)  # (ps lists the shared runner once)
            if path != "/api/ps":  # (tiny and tiny2 share one model file: Ollama runs and lists one)
                async with s.get(r.url + path, headers={"Authorization": "Bearer all-key-0123456789"}) as resp:
                    assert "tiny2" in await resp.text(), path
        for model in ("tiny2", "no-such-model"):
            async with s.get(r.url + f"/v1/models/{model}", headers=AUTH) as resp:
                assert resp.status == 404
            async with s.post(r.url + "/api/show", json={"model": model}, headers=AUTH) as resp:
                body = await resp.json()
                assert resp.status == 404 and set(body) == {"error"}, body
        async with s.post(r.url + "/api/show", json={"model": "tiny"}, headers=AUTH) as resp:
            assert resp.status == 200 and "template" in await resp.json()
