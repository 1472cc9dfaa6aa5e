"""One generation request as the mock sees it, parsed from either API's body."""

from __future__ import annotations

import json

from . import fidelity
from . import http as web
from .continuation import answer_offset
from .text import chat_prompt


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Generation:
    """What one generation request asks for, parsed from either API's body."""

    __slots__ = (
        "api",
        "kind",
        "model",
        "stream",
        "max_tokens",
        "prompt_text",
        "include_usage",
        "inputs",
        "offset",
        "extras",
        "b64",
    )

    def __init__(
        self,
        api: str,
        kind: str,
        model: str,
        stream: bool,
        max_tokens: int | None,
        prompt_text: str,
        include_usage: bool = False,
        inputs: list[str] | None = None,
    ):
        self.api, self.kind, self.model, self.stream = api, kind, model, stream
        self.max_tokens, self.prompt_text = max_tokens, prompt_text
        self.include_usage, self.inputs = include_usage, inputs or []
        self.offset = 0  # answer tokens already given (continuing a trailing assistant message)
        self.extras: fidelity.Extras | None = None  # n, a tool call, a JSON schema (fidelity.py)
        self.b64 = False  # encoding_format: base64


def _parse_generation(api: str, kind: str, body: dict) -> Generation:
    """The request `body` asks for; a body of another shape is answered 400, as a real server's
    schema validation answers it (never a 500: the body is the client's fault)."""
    try:
        return _parse(api, kind, body)
    except (TypeError, AttributeError, KeyError, ValueError) as e:
        raise BadRequest(400, f"malformed request body ({type(e).__name__}: {e})") from None


def _parse(api: str, kind: str, body: dict) -> Generation:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(400, "model is required")
    stream = body.get("stream", api == "ollama" and kind in ("chat", "generate"))
    if not isinstance(stream, bool):
        raise BadRequest(400, "stream must be a boolean")
    if kind in ("embed", "embeddings"):
        raw = body.get("input", body.get("prompt", ""))
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            raise BadRequest(400, "input must be a string or a list of strings")
        gen = Generation(api, kind, model, False, None, "".join(inputs), inputs=inputs)
        encoding = body.get("encoding_format")
        if encoding not in (None, "float", "base64"):
            raise BadRequest(400, "encoding_format must be 'float' or 'base64'")
        gen.b64 = api == "openai" and encoding == "base64"
        return gen
    if api == "ollama":
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise BadRequest(400, "options must be an object")
        max_tokens = options.get("num_predict")
    else:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise BadRequest(400, "the token limit must be an integer")
    if kind == "chat":
        messages = body.get("messages") or []
        if not isinstance(messages, list):
            raise BadRequest(400, "messages must be a list")
        _check_parts(messages)
        prompt_text = chat_prompt(messages)
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = "".join(p for p in prompt if isinstance(p, str))
        if not isinstance(prompt, str):
            raise BadRequest(400, "prompt must be a string")
        prompt_text = prompt
    stream_options = body.get("stream_options") or {}
    include_usage = bool(isinstance(stream_options, dict) and stream_options.get("include_usage"))
    gen = Generation(api, kind, model, stream, max_tokens, prompt_text, include_usage)
    if kind == "chat":
        gen.offset = answer_offset(body.get("messages") or [])
    gen.extras = fidelity.parse(api, kind, body)
    return gen


def _check_parts(messages: list) -> None:
    """Messages are objects whose `role` is a string and `content` a string, a list or null;
    content parts are objects with a string `type`, and their `text`, when present, is a
    string (OpenAI's, vLLM's and Ollama's schemas refuse anything else with a 400)."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role", ""), str):
            raise BadRequest(400, f"messages[{i}] must be an object with a string role")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(400, f"messages[{i}].content must be a string or a list of parts")
        for p in content if isinstance(content, list) else ():
            if not isinstance(p, dict) or not isinstance(p.get("type"), str):
                raise BadRequest(400, f"messages[{i}].content: each part must be an object with a string type")
            if "text" in p and not isinstance(p["text"], str):
                raise BadRequest(400, f"messages[{i}].content: a part's text must be a string")


async def read_json(request: web.Request) -> dict:
    """A request's JSON object, or a 400 the server answers in the route's shape."""
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        raise BadRequest(400, "invalid JSON body") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the JSON body must be an object")
    return body
