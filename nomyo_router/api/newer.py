"""The newer OpenAI-compatible generation routes: what they are and how their bodies are checked.

`POST /v1/responses` (the Responses API), `/v1/rerank` and `/rerank` (vLLM, llama.cpp),
`/v1/images/generations`, `/v1/audio/transcriptions` (multipart) are routed by model like
chat — admission, queue, affinity, retries — and passed through to the backends. Which
backend types serve a route: `ONLY_ON` (the others are never chosen for it; a model served
only by them gets a 501 in the caller's shape). Ollama v0.24 serves `/v1/responses`,
`/v1/images/generations`, `/v1/audio/transcriptions` and `/v1/messages`, not rerank.

A transcription's body is multipart: it is read once (bounded by `max_body_bytes`, kept for
a retry on another endpoint) and forwarded as it came, with its own Content-Type; the model
is read from the `model` form field without decoding the file part. Field names are read as
Go's mime/multipart reads them, and a body Ollama could read otherwise (a field twice, a name
spelt another way, a boundary inside a part) is refused: body_keys.py.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from . import body_keys
from .errors import ApiError

ROUTES: dict[str, tuple[str, str]] = {
    "/v1/responses": ("openai", "responses"),
    "/v1/rerank": ("openai", "rerank"),
    "/rerank": ("openai", "rerank"),
    "/v1/images/generations": ("openai", "images"),
    "/v1/audio/transcriptions": ("openai", "transcription"),
}
KINDS = frozenset(kind for _, kind in ROUTES.values())
# route -> the only backend type that serves it
ONLY_ON: dict[str, str] = {"/v1/messages": "ollama", "/v1/rerank": "openai", "/rerank": "openai"}

_MAX_FIELD = 4096
_ID = re.compile(rb'"id"\s*:\s*"([^"]{1,200})"')  # a form field's value (the model name) is never longer


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def check(kind: str, body: dict[str, Any]) -> None:
    """Validate a JSON body of one of the newer routes (400 in OpenAI's shape)."""
    if kind == "responses":
        value = body.get("input")
        if value is None:
            raise _bad("input is required", "input")
        if not isinstance(value, (str, list)):
            raise _bad("input must be a string or a list of input items", "input")
        if body.get("instructions") is not None and not isinstance(body["instructions"], str):
            raise _bad("instructions must be a string", "instructions")
        if body.get("max_output_tokens") is not None and not _is_int(body["max_output_tokens"]):
            raise _bad("max_output_tokens must be an integer", "max_output_tokens")
    elif kind == "rerank":
        if not isinstance(body.get("query"), str):
            raise _bad("query is required and must be a string", "query")
        docs = body.get("documents")
        if not isinstance(docs, list) or not docs:
            raise _bad("documents must be a non-empty list", "documents")
        if body.get("top_n") is not None and not _is_int(body["top_n"]):
            raise _bad("top_n must be an integer", "top_n")
    elif kind == "images":
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            raise _bad("prompt is required and must be a string", "prompt")
        if body.get("n") is not None and not (_is_int(body["n"]) and body["n"] >= 1):
            raise _bad("n must be an integer >= 1", "n")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def multipart(raw: bytes) -> tuple[str, dict[str, str]]:
    """(the Content-Type to forward, the small text fields) of a multipart/form-data body.

    The boundary is the body's first line (clients send no preamble), so the router needs
    neither the request's header nor a copy of the file part: only the text fields are
    decoded (`model`, `stream`, ...), the file's bytes are never touched."""
    first = raw[:1024].split(b"\r\n", 1)[0]
    if not first.startswith(b"--") or len(first) < 3 or not re.fullmatch(rb"--[\x21-\x7e]{1,200}", first):
        raise _bad("the body must be multipart/form-data with a `file` and a `model` field")
    delimiter = b"\r\n" + first
    fields: dict[str, str] = {}
    names: list[str] = []  # every text field, in order (body_keys.check_form_names)
    pos = len(first) + 2
    while pos < len(raw):
        head_end = raw.find(b"\r\n\r\n", pos, pos + 8192)
        if head_end < 0:  # (a part the router cannot read is one a backend might)
            raise _bad("a multipart part has no header block within 8 KB")
        head = raw[pos:head_end].decode("latin-1")
        end = raw.find(delimiter, head_end + 4)
        if end < 0:
            raise _bad("the multipart body is cut: no closing boundary")
        name, is_file = body_keys.form_part(head)  # as Go's mime/multipart reads it
        if name is not None and not is_file:
            names.append(name)
            if end - head_end - 4 <= _MAX_FIELD:
                fields[name] = raw[head_end + 4 : end].decode("utf-8", "replace")
        pos = end + len(delimiter)
        if raw[pos : pos + 2] == b"--":
            if raw[pos + 2 : pos + 4] not in (b"", b"\r\n"):  # (not the end for Go's reader, which reads on)
                raise _bad("a multipart part contains its closing boundary")
            break
        if raw[pos : pos + 2] != b"\r\n":  # a boundary is followed by CRLF or "--"; else it is part of the content
            raise _bad("a multipart part contains its boundary")
        pos += 2
    body_keys.check_form_names(names)
    return "multipart/form-data; boundary=" + first[2:].decode("latin-1"), fields


def transcription(raw: bytes) -> tuple[str, str, bool]:
    """(content type, model, stream) of a transcription request."""
    ctype, fields = multipart(raw)
    model = fields.get("model", "").strip()
    if not model:
        raise _bad("model is required (a form field)", "model")
    stream = fields.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise _bad("stream must be true or false", "stream")
    return ctype, model, stream == "true"


def others(endpoints: Any, only: str, key: str, path: str, model: str) -> list[str]:
    """The endpoints serving `key` that do not serve `path` (never chosen for it); 501 when
    no endpoint of the right type serves the model."""
    serving = [ep for ep in endpoints if ep.serves(key)]
    if not any(ep.type == only for ep in serving):
        names = ", ".join(ep.name for ep in serving)
        raise ApiError(
            501,
            f"{path} is served by {'Ollama' if only == 'ollama' else 'OpenAI-type'} backends "
            f"only; model '{model}' is only on {names}, which cannot serve it",
            code="not_implemented",
        )
    return [ep.name for ep in serving if ep.type != only]


def response_key(response_id: str) -> str:
    return "resp:" + hashlib.blake2b(response_id.encode(), digest_size=16).hexdigest()


async def remember_response(store: Any, head: bytes, endpoint: str) -> None:
    """Pin a Responses answer's id to the endpoint that produced (and may have stored) it,
    so a request continuing it with `previous_response_id` goes there. The id is the first
    `"id"` of the answer (a whole response) or of its `response.created` event (a stream)."""
    m = _ID.search(head[:4096])
    if m is not None:
        await store.set_pin(response_key(m.group(1).decode("latin-1")), endpoint)
