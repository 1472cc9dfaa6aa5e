"""Ollama API <-> OpenAI API, for Ollama-API requests whose model only OpenAI-type
backends serve. (OpenAI-API requests to Ollama backends need none: Ollama serves `/v1`.)"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

# Ollama route kind -> the OpenAI path that does the same job
OPENAI_PATH = {"chat": "/v1/chat/completions", "generate": "/v1/completions",
               "embed": "/v1/embeddings", "embeddings": "/v1/embeddings"}

_OPTION_MAP = {"num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p",
               "stop": "stop", "seed": "seed", "frequency_penalty": "frequency_penalty",
               "presence_penalty": "presence_penalty"}


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def request_to_openai(kind: str, body: dict[str, Any], model: str, stream: bool) -> bytes:
    """The OpenAI request body for an Ollama-API request body."""
    if kind in ("embed", "embeddings"):
        raw = body.get("input", body.get("prompt", ""))
        return json.dumps({"model": model, "input": raw}).encode()
    out: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        out["stream_options"] = {"include_usage": True}
    if kind == "chat":
        out["messages"] = [_message(m) for m in body.get("messages") or []]
    else:
        prompt = body.get("prompt", "")
        system = body.get("system")
        out["prompt"] = f"{system}\n\n{prompt}" if system else prompt
    options = body.get("options") or {}
    for src, dst in _OPTION_MAP.items():
        if src in options and options[src] is not None:
            value = options[src]
            if src == "num_predict" and isinstance(value, int) and value < 0:
                continue  # -1 means "no limit" in Ollama
            out[dst] = value
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "response", "schema": fmt}}
    return json.dumps(out).encode()


def _message(m: Any) -> Any:
    if not isinstance(m, dict):
        return m
    out = {"role": m.get("role", "user"), "content": m.get("content", "")}
    images = m.get("images")
    if images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": out["content"]}]
        parts += [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}}
                  for img in images]
        out["content"] = parts
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    return out


def _usage_fields(usage: Any, elapsed_ns: int) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    return {"total_duration": elapsed_ns, "load_duration": 0,
            "prompt_eval_count": int(usage.get("prompt_tokens") or 0), "prompt_eval_duration": 0,
            "eval_count": int(usage.get("completion_tokens") or 0), "eval_duration": 0}


def response_to_ollama(kind: str, data: Any, model: str, elapsed_ns: int) -> dict[str, Any]:
    """The Ollama response body for a complete OpenAI response body."""
    if not isinstance(data, dict):
        raise ValueError("backend answered with a non-object body")
    if kind == "embeddings":
        return {"embedding": data["data"][0]["embedding"] if data.get("data") else []}
    if kind == "embed":
        return {"model": model, "embeddings": [d["embedding"] for d in data.get("data", [])],
                "total_duration": elapsed_ns, "load_duration": 0,
                "prompt_eval_count": int((data.get("usage") or {}).get("prompt_tokens") or 0)}
    choice = (data.get("choices") or [{}])[0]
    out: dict[str, Any] = {"model": model, "created_at": _now_iso()}
    if kind == "chat":
        msg = choice.get("message") or {}
        out["message"] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            out["message"]["tool_calls"] = msg["tool_calls"]
    else:
        out["response"] = choice.get("text") or ""
    out.update(done=True, done_reason=_done_reason(choice.get("finish_reason")),
               **_usage_fields(data.get("usage"), elapsed_ns))
    return out


def _done_reason(finish: Any) -> str:
    return "length" if finish == "length" else "stop"


def error_message(raw: bytes) -> str:
    """The message of an error body in either shape, for re-wrapping."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:500] or "backend error"
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or data)


class SseToNdjson:
    """Turns an OpenAI SSE stream into Ollama NDJSON chunks, line by line."""

    def __init__(self, kind: str, model: str, t0: float) -> None:
        self.kind, self.model, self.t0 = kind, model, t0
        self.finish: Any = None
        self.usage: Any = None
        self.done = False
        self.created_at = _now_iso()

    def line(self, raw: bytes) -> bytes | None:
        raw = raw.strip()
        if not raw.startswith(b"data:"):
            return None
        payload = raw[5:].strip()
        if payload == b"[DONE]":
            return self.final()
        try:
            data = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        if data.get("usage"):
            self.usage = data["usage"]
        if isinstance(data.get("error"), (dict, str)):
            return json.dumps({"error": error_message(payload)}).encode() + b"\n"
        choices = data.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        if self.kind == "chat":
            text = (choice.get("delta") or {}).get("content")
        else:
            text = choice.get("text")
        if not text:
            return None
        chunk: dict[str, Any] = {"model": self.model, "created_at": self.created_at}
        if self.kind == "chat":
            chunk["message"] = {"role": "assistant", "content": text}
        else:
            chunk["response"] = text
        chunk["done"] = False
        return json.dumps(chunk).encode() + b"\n"

    def final(self) -> bytes | None:
        if self.done:
            return None
        self.done = True
        chunk: dict[str, Any] = {"model": self.model, "created_at": _now_iso()}
        if self.kind == "chat":
            chunk["message"] = {"role": "assistant", "content": ""}
        else:
            chunk["response"] = ""
        elapsed_ns = int((time.perf_counter() - self.t0) * 1e9)
        chunk.update(done=True, done_reason=_done_reason(self.finish),
                     **_usage_fields(self.usage, elapsed_ns))
        return json.dumps(chunk).encode() + b"\n"
