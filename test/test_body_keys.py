"""One meaning per body (nomyo_router/api/body_keys.py): a body a backend could read otherwise
than the router — a top-level key twice, a key spelt in another case (Go's encoding/json, i.e.
Ollama, matches keys to fields case-insensitively, the last one winning), a multipart field
twice or spelt another way — is a 400 in the caller's shape, naming the key, and never reaches
a backend. Through a real router on sockets, with a client key allowed only `llama3` and mocks
that also serve SECRET; and, in-process, the parse equals json.loads for every other body."""

from __future__ import annotations

import json
import string
from typing import Any

import aiohttp
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mock import http as web
from mock import run_mock
from nomyo_router.api import body_keys, multipart
from nomyo_router.api.errors import ApiError
from nomyo_router.api.requests import GENERATION_ROUTES, load_json
from test.conftest import FAST
from test.helpers import run_router

KEY = "limited-key-0123456789"
ALLOWED, SECRET = "llama3", "qwen2.5:7b"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "hi"}]
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


def with_member(body: dict[str, Any], member: str, where: str) -> bytes:
    text = json.dumps(body, ensure_ascii=False)
    text = "{" + member + ", " + text[1:] if where == "start" else text[:-1] + ", " + member + "}"
    return text.encode()


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


@pytest.fixture
async def router():
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


def form(*fields: tuple[bytes, bytes], boundary: bytes = b"b0undary7MA4YWxk") -> bytes:
    """A multipart body: (Content-Disposition parameters, value) per text field, then a file."""
    parts = [b"Content-Disposition: form-data; " + spelt + b"\r\n\r\n" + value for spelt, value in fields]
    parts.append(
        b'Content-Disposition: form-data; name="file"; filename="talk.wav"\r\nContent-Type: audio/wav'
        b"\r\n\r\nRIFF\x00\x01\x02\r\n--not-the-boundary\r\n"
    )
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary + b"--\r\n"


MULTIPART_BYPASSES = [  # (fields, the name the error names)
    ([(b'name="model"', ALLOWED.encode()), (b'name="model"', SECRET.encode())], "model"),
    ([(b'name="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b"name=model", SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'NAME="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'Name="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'name="Model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "Model"),
    ([(b'name="MODEL"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "MODEL"),
    ([(b'name="model"; filename=""', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'name="model"', ALLOWED.encode()), (b'name="stream"', b"false"), (b'name="stream"', b"true")], "stream"),
]


async def test_multipart_transcription_bypasses_are_refused(router):
    url, seen = router
    ctype = "multipart/form-data; boundary=b0undary7MA4YWxk"
    path = "/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as s:
        for fields, key in MULTIPART_BYPASSES:
            status, body = await post(s, url + path, form(*fields), ctype)
            assert_refused(path, status, body, key)
        for fields in (
            [(b"name=\"prompt\"; name*=utf-8''model", SECRET.encode()), (b'name="model"', ALLOWED.encode())],
            [(b'name="model"\r\nContent-Transfer-Encoding: quoted-printable', ALLOWED.encode())],
            [
                (b'name="x"\r\nX-Other: 1\nContent-Disposition: form-data; name="model"', SECRET.encode()),
                (b'name="model"', ALLOWED.encode()),
            ],
        ):
            status, body = await post(s, url + path, form(*fields), ctype)
            assert status == 400 and body["error"]["type"] == "invalid_request_error", body
        # a boundary inside a part (Go's reader reads on; the router would stop)
        raw = form((b'name="model"', ALLOWED.encode())).replace(b"--b0undary7MA4YWxk--", b"--b0undary7MA4YWxk--x", 1)
        assert (await post(s, url + path, raw, ctype))[0] == 400
        raw = form((b'name="model"', ALLOWED.encode() + b"\r\n--b0undary7MA4YWxkX"))
        assert (await post(s, url + path, raw, ctype))[0] == 400
        assert seen == []
        status, body = await post(s, url + path, form((b'name="model"', ALLOWED.encode())), ctype)
        assert status == 200 and body["text"].startswith("mock transcription")
    assert seen == [path]


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


# ---- in-process: the parse is json.loads's, keys aside --------------------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "model",
        "Model",
        "MODEL",
        "stream",
        "\u017ftream",
        "keep_alive",
        "\u212aeep_alive",
        "messages",
        "name",
        "x",
        "X",
        "é",
        "É",
    ]
) | st.text(max_size=6)


def escaped(key: str, draw: Any) -> str:
    """`key` as JSON text, each character written plainly or as \\uXXXX at random."""
    out = []
    for ch in key:
        plain = json.dumps(ch, ensure_ascii=False)[1:-1]
        out.append(draw(st.sampled_from([plain, f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else plain])))
    return '"' + "".join(out) + '"'


@st.composite
def bodies(draw: Any) -> tuple[str, list[str]]:
    """A JSON object's text with random keys (repeats and case variants likely), random
    escaping of the keys, random whitespace; and its keys in order."""
    keys = draw(st.lists(KEYS, max_size=5))
    ws = st.sampled_from(["", " ", "\n", " \t", "\r\n  "])
    members = []
    for key in keys:
        value = json.dumps(draw(JSON_VALUES), ensure_ascii=draw(st.booleans()))
        members.append(escaped(key, draw) + draw(ws) + ":" + draw(ws) + value)
    return draw(ws) + "{" + draw(ws) + ("," + draw(ws)).join(members) + draw(ws) + "}" + draw(ws), keys


def expected_refusal(keys: list[str]) -> str | None:
    """The key the check must name (the first given twice; else the first spelt as a field
    is not, or folding like an earlier one), or None when the body is acceptable."""
    if len(set(keys)) != len(keys):
        return next(k for i, k in enumerate(keys) if k in keys[:i])
    fields = {f.casefold(): f for f in body_keys.FIELDS}
    folded: set[str] = set()
    for key in keys:
        if fields.get(key.casefold(), key) != key or key.casefold() in folded:
            return key
        folded.add(key.casefold())
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
def test_objects_parse_as_json_loads_or_are_refused_naming_the_key(case):
    text, keys = case
    raw = text.encode()
    want = expected_refusal(keys)
    if want is None:
        assert body_keys.loads(raw) == json.loads(raw)
        return
    with pytest.raises(ApiError) as e:
        body_keys.loads(raw)
    assert e.value.status == 400 and e.value.param == want
    assert json.dumps(want, ensure_ascii=False) in e.value.message


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        st.text(alphabet=string.printable, max_size=40).map(str.encode),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()),
        JSON_VALUES.map(lambda v: json.dumps(v).encode()).map(lambda b: b[: len(b) // 2]),
    )
)
def test_anything_else_parses_or_fails_exactly_as_json_loads(raw):
    try:
        want: Any = json.loads(raw)
    except (ValueError, RecursionError) as e:
        with pytest.raises(type(e)) as got:
            body_keys.loads(raw)
        assert str(got.value) == str(e)
        return
    if isinstance(want, dict) and (
        len({k.casefold() for k in want}) != len(want) or not body_keys.FIELDS.issuperset(want)
    ):
        try:
            assert body_keys.loads(raw) == want
        except ApiError:
            pass
        return
    assert body_keys.loads(raw) == want


def test_load_json_keeps_its_limits():
    with pytest.raises(ApiError, match="nested deeper"):
        load_json(b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}")
    with pytest.raises(ApiError, match="lone surrogate"):
        load_json(b'{"model": "x", "prompt": "\\ud800"}')
    with pytest.raises(ApiError, match="invalid JSON"):
        load_json(b'{"model": "x",}')
    assert load_json(b'\xef\xbb\xbf{"model": "x"}') == {"model": "x"}  # (json.loads reads a UTF-8 BOM too)
    assert load_json('{"model": "x"}'.encode("utf-16")) == {"model": "x"}
    with pytest.raises(ApiError, match='"model"'):
        load_json('{"model": "x", "model": "y"}'.encode("utf-16"))


async def test_multipart_bodies_of_the_usual_clients_are_read():
    """aiohttp, httpx (the openai client), urllib3 (requests) and a file part marked
    `Content-Transfer-Encoding: binary` (Java's HttpMime): the model is read, nothing refused."""
    import httpx
    import urllib3

    form = aiohttp.FormData()
    form.add_field("model", ALLOWED)
    form.add_field("file", b"RIFF\r\n--x", filename="r\u00e9sum\u00e9.wav", content_type="audio/wav")
    writer = form()

    class Sink:
        data = b""

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await writer.write(sink)
    bodies = [
        sink.data,
        httpx.Request(
            "POST",
            "http://x",
            data={"model": ALLOWED, "language": "en"},
            files={"file": ("r\u00e9sum\u00e9.wav", b"RIFF", "audio/wav")},
        ).read(),
        urllib3.encode_multipart_formdata(
            {"model": ALLOWED, "file": ("a.wav", b"RIFF", "audio/wav")}, boundary="urllib3boundary"
        )[0],
        form_raw := form_bytes(
            [(b'name="model"', ALLOWED.encode())],
            file_head=b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\nContent-Transfer-Encoding: binary",
        ),
    ]
    for raw in bodies:
        assert multipart.transcription(raw)[1:] == (ALLOWED, False), raw[:300]
    with pytest.raises(ApiError):
        multipart.transcription(form_raw.replace(b"binary", b"quoted-printable"))


def form_bytes(fields: list[tuple[bytes, bytes]], file_head: bytes, boundary: bytes = b"bNd") -> bytes:
    parts = [b"Content-Disposition: form-data; " + spelt + b"\r\n\r\n" + value for spelt, value in fields]
    parts.append(file_head + b"\r\n\r\nRIFF")
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary + b"--\r\n"
