"""A kept answer in the request's API shape: whole, or as a complete stream.

Streams end as their API's do: Ollama's NDJSON with a `done: true` record (its counts in it),
OpenAI's SSE with a finish record, a usage record when `stream_options.include_usage` asked
for one, and `data: [DONE]`. Ids and timestamps are fresh; durations are the router's own
time for the hit (there was no prompt evaluation to time).
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from ..api.requests import GenRequest
from .answer import Answer, Choice

NDJSON, SSE, JSON = b"application/x-ndjson", b"text/event-stream", b"application/json"


def body(req: GenRequest, answer: Answer, elapsed_ns: int) -> tuple[bytes, bytes]:
    """(content type, body) answering `req` with `answer`."""
    if answer.whole is not None:
        return JSON, answer.whole
    if req.api == "ollama":
        return (
            (NDJSON, _ollama_stream(req, answer, elapsed_ns))
            if req.stream
            else (JSON, _dumps(_ollama_last(req, answer, answer.choices[0], elapsed_ns, whole=True)))
        )
    return (SSE, _openai_stream(req, answer)) if req.stream else (JSON, _dumps(_openai_whole(req, answer)))


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# ---- Ollama --------------------------------------------------------------------------------
def _ollama_part(req: GenRequest, choice: Choice, created: str, whole: bool) -> dict[str, Any]:
    """The content of one record: a chat message or a generate response."""
    out: dict[str, Any] = {"model": req.model, "created_at": created}
    if req.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": choice.text if whole else ""}
        if whole and choice.thinking:
            message["thinking"] = choice.thinking
        if whole and choice.tool_calls:
            message["tool_calls"] = choice.tool_calls
        out["message"] = message
    else:
        out["response"] = choice.text if whole else ""
        if whole and choice.thinking:
            out["thinking"] = choice.thinking
    return out


def _ollama_last(req: GenRequest, answer: Answer, choice: Choice, elapsed_ns: int, whole: bool) -> dict[str, Any]:
    out = _ollama_part(req, choice, _now_iso(), whole)
    out.update(done=True, done_reason=choice.finish or "stop", total_duration=elapsed_ns, load_duration=0)
    if answer.prompt_tokens is not None:
        out.update(prompt_eval_count=answer.prompt_tokens, prompt_eval_duration=0)
    if answer.completion_tokens is not None:
        out.update(eval_count=answer.completion_tokens, eval_duration=0)
    return out


def _ollama_stream(req: GenRequest, answer: Answer, elapsed_ns: int) -> bytes:
    choice = answer.choices[0]
    lines = []
    if choice.text or choice.thinking or choice.tool_calls:
        lines.append(_dumps({**_ollama_part(req, choice, _now_iso(), True), "done": False}))
    lines.append(_dumps(_ollama_last(req, answer, choice, elapsed_ns, False)))
    return b"\n".join(lines) + b"\n"


# ---- OpenAI --------------------------------------------------------------------------------
def _usage(answer: Answer) -> dict[str, int] | None:
    if answer.prompt_tokens is None and answer.completion_tokens is None:
        return None
    p, c = answer.prompt_tokens or 0, answer.completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _head(req: GenRequest, chunk: bool) -> dict[str, Any]:
    chat = req.kind == "chat"
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12),
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
    }


def _openai_whole(req: GenRequest, answer: Answer) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(answer.choices):
        item: dict[str, Any] = {"index": i}
        if req.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not c.tool_calls else None}
            if c.thinking:
                message["reasoning_content"] = c.thinking
            if c.tool_calls:
                message["tool_calls"] = c.tool_calls
            item["message"] = message
        else:
            item["text"] = c.text
        item.update(logprobs=None, finish_reason=c.finish or "stop")
        choices.append(item)
    out = {**_head(req, False), "choices": choices}
    usage = _usage(answer)
    if usage is not None:
        out["usage"] = usage
    return out


def _openai_stream(req: GenRequest, answer: Answer) -> bytes:
    head = _head(req, True)
    events: list[dict[str, Any]] = []

    def add(index: int, delta: dict[str, Any] | str, finish: str | None = None) -> None:
        item: dict[str, Any] = {"index": index}
        if req.kind == "chat":
            item["delta"] = delta
        else:
            item.update(text=delta, logprobs=None)
        item["finish_reason"] = finish
        events.append({**head, "choices": [item]})

    chat = req.kind == "chat"
    for i, c in enumerate(answer.choices):
        if chat:
            add(i, {"role": "assistant", "content": ""})
            if c.thinking:
                add(i, {"reasoning_content": c.thinking})
        if c.text or not chat:
            add(i, {"content": c.text} if chat else c.text)
        if chat and c.tool_calls:
            add(i, {"tool_calls": [{"index": j, **call} for j, call in enumerate(c.tool_calls)]})
        add(i, {} if chat else "", c.finish or "stop")
    so = req.body.get("stream_options")
    usage = _usage(answer)
    if isinstance(so, dict) and so.get("include_usage") is True and usage is not None:
        events.append({**head, "choices": [], "usage": usage})
    return b"".join(b"data: " + _dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
