"""What is kept of an answer: its text, thinking, tool calls, finish reason and token counts.

Kept in this neutral form, not as the bytes the client got, so one entry answers a streamed
request and a whole one alike (`stream` is not part of the key), each in its own shape and
with fresh ids and timestamps. Tool calls stay in the API's own shape (the route is part of
the key, so an entry is only ever rendered for the API it came from). Embeddings are kept as
the answer's bytes: there is no stream to render them as.

An answer that is not complete — a stream without its last record (`done: true`, `[DONE]`),
an error record anywhere, a body that does not parse — is not kept (None).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


class Choice(msgspec.Struct, omit_defaults=True):
    text: str = ""
    thinking: str = ""
    tool_calls: list[dict[str, Any]] | None = None  # as the backend wrote them
    finish: str | None = None


class Answer(msgspec.Struct, omit_defaults=True):
    choices: list[Choice] = []
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    whole: bytes | None = None  # embeddings: the answer as it was


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Answer).decode


def encode(answer: Answer) -> bytes:
    return _encode(answer)


def decode(data: bytes) -> Answer | None:
    try:
        return _decode(data)
    except msgspec.DecodeError:  # written by another version: a miss, not a failure
        return None


def of_whole(api: str, kind: str, data: bytes) -> Answer | None:
    """The answer in a whole (non-stream) body."""
    if kind in ("embed", "embeddings"):
        return Answer(whole=data)
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "error" in obj:
        return None
    if api == "ollama":
        m = obj.get("message") if kind == "chat" else obj
        if not isinstance(m, dict) or obj.get("done") is False:
            return None
        text = m.get("content") if kind == "chat" else m.get("response")
        choice = Choice(text or "", m.get("thinking") or "", m.get("tool_calls") or None, obj.get("done_reason"))
        return Answer([choice], _int(obj.get("prompt_eval_count")), _int(obj.get("eval_count")))
    choices = []
    for c in sorted(obj.get("choices") or [], key=lambda c: c.get("index", 0)):
        if kind == "chat":
            m = c.get("message") or {}
            choices.append(
                Choice(
                    m.get("content") or "",
                    m.get("reasoning_content") or m.get("reasoning") or "",
                    m.get("tool_calls") or None,
                    c.get("finish_reason"),
                )
            )
        else:
            choices.append(Choice(c.get("text") or "", finish=c.get("finish_reason")))
    if not choices:
        return None
    usage = obj.get("usage") or {}
    return Answer(choices, _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))


def of_stream(api: str, kind: str, data: bytes) -> Answer | None:
    """The answer in a whole relayed stream (Ollama NDJSON or OpenAI SSE)."""
    try:
        return _ndjson(kind, data) if api == "ollama" else _sse(kind, data)
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


def _ndjson(kind: str, data: bytes) -> Answer | None:
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for line in data.splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        if "error" in obj:
            return None
        m = (obj.get("message") or {}) if kind == "chat" else obj
        text.append((m.get("content") if kind == "chat" else m.get("response")) or "")
        thinking.append(m.get("thinking") or "")
        calls.extend(m.get("tool_calls") or ())
        if obj.get("done"):
            choice = Choice("".join(text), "".join(thinking), calls or None, obj.get("done_reason"))
            return Answer([choice], _int(obj.get("prompt_eval_count")), _int(obj.get("eval_count")))
    return None  # no last record: cut short


def _sse(kind: str, data: bytes) -> Answer | None:
    parts: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    for line in data.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            if not parts:
                return None
            choices = [
                Choice("".join(p["text"]), "".join(p["thinking"]), _calls(p["calls"]), p["finish"])
                for _, p in sorted(parts.items())
            ]
            return Answer(choices, _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
        obj = json.loads(payload)
        if "error" in obj:
            return None
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        for c in obj.get("choices") or ():
            p = parts.setdefault(c.get("index", 0), {"text": [], "thinking": [], "calls": {}, "finish": None})
            if kind == "chat":
                d = c.get("delta") or {}
                p["text"].append(d.get("content") or "")
                p["thinking"].append(d.get("reasoning_content") or d.get("reasoning") or "")
                for tc in d.get("tool_calls") or ():
                    _merge_call(p["calls"], tc)
            else:
                p["text"].append(c.get("text") or "")
            if c.get("finish_reason"):
                p["finish"] = c["finish_reason"]
    return None  # no [DONE]: cut short


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """One streamed tool-call delta into the call it continues (by its `index`)."""
    call = calls.setdefault(
        delta.get("index", len(calls)), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    fn = delta.get("function") or {}
    call["function"]["name"] += fn.get("name") or ""
    call["function"]["arguments"] += fn.get("arguments") or ""


def _calls(calls: dict[int, dict[str, Any]]) -> list[dict[str, Any]] | None:
    return [c for _, c in sorted(calls.items())] or None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
