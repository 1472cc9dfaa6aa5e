"""A whole answer assembled from the stream the router asked for in its place.

A client that wants a whole answer (`"stream": false`) may get one the backend streamed
(assembled.py says when): the router asks for a stream, relays nothing until
it ended, and answers with what the backend's own whole answer would have been:

- Ollama (`/api/chat`, `/api/generate`): the final object (`done: true`, with its counts,
  durations, `done_reason`, `context`) holding the whole `message` (content, thinking, tool
  calls) or `response`;
- OpenAI-compatible (`/v1/chat/completions`, `/v1/completions`): a `chat.completion` or
  `text_completion` with every choice (by `index`: content, reasoning, refusal, tool calls
  merged by their index, logprobs, finish reason) and the `usage` the router asked for
  (`stream_options.include_usage`).

Here are the mechanics: the body that asks for the stream (`stream_body`), the answer's
length bound (`length_bound`), and the assembly (`whole`).
"""

from __future__ import annotations

import json
from typing import Any

from ..backends import stream_lines

STREAMED = frozenset((("ollama", "chat"), ("ollama", "generate"), ("openai", "chat"), ("openai", "generate")))


def length_bound(api: str, body: dict[str, Any]) -> int | None:
    """The most tokens the request lets the answer have (`num_predict`, `max_tokens`,
    `max_completion_tokens`); None when it sets no bound."""
    if api == "ollama":
        options = body.get("options")
        value = options.get("num_predict") if isinstance(options, dict) else None
    else:
        value = body.get("max_completion_tokens")
        if value is None:
            value = body.get("max_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def stream_body(api: str, body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """`body` asking for a stream (OpenAI's with its usage); `model`: the backend's name for it."""
    out = {**body, "stream": True}
    if model is not None:
        out["model"] = model
    if api == "openai":
        out["stream_options"] = {"include_usage": True}
    return out


def whole(api: str, kind: str, stream: bytes, count: bool = False) -> bytes:
    """The whole answer (JSON bytes) for the records of `stream`, a complete stream; ValueError
    when it holds no answer. `count`: an OpenAI stream without usage gets its content chunks
    as `usage.completion_tokens` (for the translation to Ollama's counts, as a translated
    stream's are; an OpenAI client gets no usage, as the server sent none)."""
    if api == "ollama":
        return json.dumps(_ollama(kind, stream)).encode()
    return json.dumps(_openai(kind, stream, count)).encode()


def _ollama(kind: str, stream: bytes) -> dict[str, Any]:
    content: list[str] = []
    thinking: list[str] = []
    calls: list[Any] = []
    logprobs: list[Any] = []
    final: dict[str, Any] | None = None
    for line in stream.split(b"\n"):
        obj = stream_lines.parse(line)
        if obj is None:
            continue
        if kind == "chat":
            msg = obj.get("message")
            if isinstance(msg, dict):
                _add(content, msg.get("content"))
                _add(thinking, msg.get("thinking"))
                if isinstance(msg.get("tool_calls"), list):
                    calls += msg["tool_calls"]
        else:
            _add(content, obj.get("response"))
            _add(thinking, obj.get("thinking"))
        if isinstance(obj.get("logprobs"), list):
            logprobs += obj["logprobs"]
        if obj.get("done") is True:
            final = obj
    if final is None:
        raise ValueError("the backend's stream ended without its final record")
    out = dict(final)
    if kind == "chat":
        msg = dict(final["message"]) if isinstance(final.get("message"), dict) else {"role": "assistant"}
        msg["content"] = "".join(content)
        if thinking:
            msg["thinking"] = "".join(thinking)
        if calls:
            msg["tool_calls"] = calls
        out["message"] = msg
    else:
        out["response"] = "".join(content)
        if thinking:
            out["thinking"] = "".join(thinking)
    if logprobs:
        out["logprobs"] = logprobs
    return out


def _add(parts: list[str], piece: object) -> None:
    if isinstance(piece, str) and piece:
        parts.append(piece)


class _Choice:
    __slots__ = ("index", "role", "content", "reasoning", "reasoning_key", "refusal", "calls", "logprobs", "finish")

    def __init__(self, index: int) -> None:
        self.index = index
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key = "reasoning_content"
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, Any] | None = None
        self.finish: object = None

    def delta(self, d: dict[str, Any]) -> None:
        if isinstance(d.get("role"), str):
            self.role = d["role"]
        _add(self.content, d.get("content"))
        for key in ("reasoning_content", "reasoning"):
            if isinstance(d.get(key), str) and d[key]:
                self.reasoning_key = key
                self.reasoning.append(d[key])
        _add(self.refusal, d.get("refusal"))
        for tc in d.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            index = tc.get("index")
            slot = self.calls.setdefault(index if isinstance(index, int) else len(self.calls), {})
            if tc.get("id"):
                slot["id"] = tc["id"]
            if tc.get("type"):
                slot["type"] = tc["type"]
            fn = tc.get("function")
            if isinstance(fn, dict):
                f = slot.setdefault("function", {"name": "", "arguments": ""})
                f["name"] += fn.get("name") or ""
                f["arguments"] += fn.get("arguments") or ""

    def more_logprobs(self, lp: object) -> None:
        if not isinstance(lp, dict):
            return
        if self.logprobs is None:
            self.logprobs = {}
        for key, value in lp.items():
            if isinstance(value, list):
                self.logprobs.setdefault(key, []).extend(value)
            else:
                self.logprobs.setdefault(key, value)

    def chat(self) -> dict[str, Any]:
        calls = [{"type": "function", **c} for _, c in sorted(self.calls.items())]
        content = "".join(self.content) if self.content or not calls else None  # (only calls: null, as OpenAI)
        msg: dict[str, Any] = {"role": self.role, "content": content}
        if self.reasoning:
            msg[self.reasoning_key] = "".join(self.reasoning)
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        if calls:
            msg["tool_calls"] = calls
        return {"index": self.index, "message": msg, "logprobs": self.logprobs, "finish_reason": self.finish}

    def text(self) -> dict[str, Any]:
        text = "".join(self.content)
        return {"text": text, "index": self.index, "logprobs": self.logprobs, "finish_reason": self.finish}


def _openai(kind: str, stream: bytes, count: bool) -> dict[str, Any]:
    head: dict[str, Any] | None = None
    choices: dict[int, _Choice] = {}
    usage: object = None
    done = False
    pieces = 0
    for event in stream.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.strip() == b"data: [DONE]":
                done = True
            obj = stream_lines.parse(line, sse=True)
            if obj is None:
                continue
            if head is None:
                head = obj
            if isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
            for c in obj.get("choices") or []:
                if not isinstance(c, dict):
                    continue
                at = c.get("index")
                index = at if isinstance(at, int) else 0
                choice = choices.get(index)
                if choice is None:
                    choice = choices[index] = _Choice(index)
                if kind == "chat":
                    delta = c.get("delta")
                    if isinstance(delta, dict):
                        choice.delta(delta)
                        pieces += bool(delta.get("content") or delta.get("tool_calls"))
                elif isinstance(c.get("text"), str) and c["text"]:
                    choice.content.append(c["text"])
                    pieces += 1
                choice.more_logprobs(c.get("logprobs"))
                if c.get("finish_reason") is not None:
                    choice.finish = c["finish_reason"]
    if head is None or not (done or usage is not None or any(c.finish is not None for c in choices.values())):
        raise ValueError("the backend's stream ended before its answer did")
    out: dict[str, Any] = {
        "id": head.get("id", ""),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": head.get("created", 0),
        "model": head.get("model", ""),
    }
    if head.get("system_fingerprint") is not None:
        out["system_fingerprint"] = head["system_fingerprint"]
    ordered = [choices[i] for i in sorted(choices)] or [_Choice(0)]
    out["choices"] = [c.chat() if kind == "chat" else c.text() for c in ordered]
    if usage is not None:
        out["usage"] = usage
    elif count:
        out["usage"] = {"completion_tokens": pieces}
    return out
