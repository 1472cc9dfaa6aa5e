"""Parsing and validating generation requests of both APIs into one `GenRequest`."""

from __future__ import annotations

import json
from typing import Any

from ..domain import model_key
from . import body_keys, image_generation, multipart, rerank, responses
from .errors import ApiError

# (api, kind) for each generation route
GENERATION_ROUTES: dict[str, tuple[str, str]] = {
    "/api/chat": ("ollama", "chat"),
    "/api/generate": ("ollama", "generate"),
    "/api/embed": ("ollama", "embed"),
    "/api/embeddings": ("ollama", "embeddings"),
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/completions": ("openai", "generate"),
    "/v1/embeddings": ("openai", "embed"),
    "/v1/messages": ("anthropic", "chat"),  # passed through to Ollama backends (they serve it)
    "/v1/responses": ("openai", "responses"),
    "/v1/rerank": ("openai", "rerank"),
    "/rerank": ("openai", "rerank"),
    "/v1/images/generations": ("openai", "images"),
    "/v1/audio/transcriptions": ("openai", "transcription"),  # multipart
}


class GenRequest:
    """One validated generation request. `raw` is forwarded untouched when APIs match."""

    __slots__ = (
        "api",
        "kind",
        "path",
        "model",
        "key",
        "stream",
        "body",
        "raw",
        "t0",
        "session_id",
        "client",
        "ctype",
        "pinned",
        "too_small",
        "routing_headers",
    )

    def __init__(
        self, api: str, kind: str, path: str, model: str, stream: bool, body: dict[str, Any], raw: bytes, t0: float
    ) -> None:
        self.api, self.kind, self.path = api, kind, path
        self.model, self.key, self.stream = model, model_key(model), stream
        self.body, self.raw, self.t0 = body, raw, t0
        self.session_id: str | None = None
        self.client: str | None = None  # the client key's name, when keys are configured
        self.ctype: str | None = None  # a Content-Type to forward instead of JSON's (multipart)
        # endpoints whose context window it exceeds (routing/context_windows.py)
        self.too_small: frozenset[str] | None = None
        self.pinned: tuple[str, ...] | None = None  # only these endpoints, no affinity (forward/ensemble.py)
        self.routing_headers = True  # its answer says where it went and why (api/access.Client)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_DEPTH = 64  # JSON nesting; real requests stay under 10
# A model name longer than this (UTF-8 bytes) is refused before anything records it: names
# are written in access lines, spans, usage and the usage stream, and compared on every
# request. Real names (`hf.co/<org>/<repo>:<quant>`) stay under 100.
MAX_MODEL_BYTES = 256


def load_json(raw: bytes) -> object:
    """Parse a request body, refusing what could crash code further on: nesting deeper than
    MAX_DEPTH and strings with lone surrogates (which cannot be encoded again), and what a
    backend could read otherwise than the router: a top-level key twice, or spelt in another
    case (body_keys.py)."""
    try:
        body = body_keys.loads(raw) if raw else None
    except RecursionError:
        raise _bad(f"the JSON body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise _bad(f"invalid JSON body: {e}") from None
    # Cheap screens first (C-speed byte counts); the walks run only when they trip.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _depth(body) > MAX_DEPTH:
        raise _bad(f"the JSON body is nested deeper than {MAX_DEPTH} levels")
    if (b"\\ud" in raw or b"\\uD" in raw) and not _encodable(body):
        raise _bad("the JSON body contains an invalid Unicode escape (a lone surrogate)")
    return body


def _depth(obj: Any) -> int:
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in item if isinstance(x, (dict, list)))
    return deepest


def _encodable(obj: Any) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def check_model(model: str) -> None:
    """400 for a model name longer than MAX_MODEL_BYTES (the UTF-8 encoding is counted only
    when the characters alone could exceed it)."""
    if len(model) > MAX_MODEL_BYTES // 4 and len(model.encode("utf-8", "surrogatepass")) > MAX_MODEL_BYTES:
        raise _bad(f"model names are at most {MAX_MODEL_BYTES} bytes", "model")


def parse(path: str, raw: bytes, t0: float) -> GenRequest:
    api, kind = GENERATION_ROUTES[path]
    if kind == "transcription":
        ctype, named, streamed = multipart.transcription(raw)
        check_model(named)
        req = GenRequest(api, kind, path, named, streamed, {"model": named}, raw, t0)
        req.ctype = ctype
        return req
    body = load_json(raw)
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    model = body.get("model")
    if model is None or model == "":
        raise _bad("model is required", "model")
    if not isinstance(model, str):
        raise _bad("model must be a string", "model")
    check_model(model)
    stream = body.get("stream")
    if stream is None:
        # Ollama streams chat and generate when the field is absent; OpenAI does not.
        stream = api == "ollama" and kind in ("chat", "generate")
    elif not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    if kind in ("embed", "embeddings"):
        stream = False
        _check_embed_input(api, kind, body)
    elif kind == "chat":
        _check_messages(api, body)
    elif kind == "responses":
        responses.check(body)
    elif kind == "rerank":
        rerank.check(body)
    elif kind == "images":
        image_generation.check(body)
    else:
        prompt = body.get("prompt", None if api == "openai" else "")
        if api == "openai" and prompt is None:
            raise _bad("prompt is required", "prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and api == "openai")):
            raise _bad("prompt must be a string", "prompt")
    if api == "ollama":
        options = body.get("options")
        if options is not None and not isinstance(options, dict):
            raise _bad("options must be an object", "options")
        if options and options.get("num_predict") is not None and not _is_int(options["num_predict"]):
            raise _bad("options.num_predict must be an integer", "options.num_predict")
    else:
        for key in ("max_tokens", "max_completion_tokens"):
            if body.get(key) is not None and not _is_int(body[key]):
                raise _bad(f"{key} must be an integer", key)
    return GenRequest(api, kind, path, model, stream, body, raw, t0)


def _check_messages(api: str, body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        if api == "openai":
            raise _bad("messages is required", "messages")
        return
    if not isinstance(messages, list):
        raise _bad("messages must be a list", "messages")
    if api == "openai" and not messages:
        raise _bad("messages must not be empty", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
        content = m.get("content")
        if api == "ollama":
            if content is not None and not isinstance(content, str):
                raise _bad(f"messages[{i}].content must be a string", f"messages[{i}].content")
            images = m.get("images")
            if images is not None and not (isinstance(images, list) and all(isinstance(x, str) for x in images)):
                raise _bad(f"messages[{i}].images must be a list of base64 strings", f"messages[{i}].images")
        elif content is not None and not isinstance(content, (str, list)):
            raise _bad(f"messages[{i}].content must be a string or a list of content parts", f"messages[{i}].content")
        elif isinstance(content, list):
            _check_parts(content, f"messages[{i}].content")
        tool_calls = m.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise _bad(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")


def _check_parts(parts: list[Any], where: str) -> None:
    """Content parts (OpenAI's, Anthropic's blocks): objects with a string `type`, whose `text`,
    when present, is a string; the router reads it (the cache, ensembles, context routing),
    and the APIs' own schemas refuse anything else."""
    for j, p in enumerate(parts):
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise _bad(f"{where}[{j}] must be an object with a string 'type'", f"{where}[{j}]")
        if "text" in p and not isinstance(p["text"], str):
            raise _bad(f"{where}[{j}].text must be a string", f"{where}[{j}].text")


def _check_embed_input(api: str, kind: str, body: dict[str, Any]) -> None:
    field = "prompt" if kind == "embeddings" else "input"
    value = body.get(field)
    if value is None:
        if api == "openai":
            raise _bad("input is required", "input")
        return
    if isinstance(value, str):
        return
    if kind != "embeddings" and isinstance(value, list) and all(isinstance(v, (str, int, list)) for v in value):
        return
    raise _bad(f"{field} must be a string or a list of strings", field)
