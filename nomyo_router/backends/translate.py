"""Ollama API <-> OpenAI API, for Ollama-API requests whose model only OpenAI-type
backends serve. (OpenAI-API requests to Ollama backends need none: Ollama serves `/v1`.)

Both ways, exactly where the two APIs have the same notion:
- `tools` pass as they are (Ollama's are OpenAI's); tool-call history becomes OpenAI's
  (`id`, `type: function`, `arguments` a JSON string; a `tool` message gets the
  `tool_call_id` of the call it answers, matched by `tool_name` or order); calls in answers
  come back with object arguments, streamed deltas assembled into one Ollama chunk;
- `think` → `chat_template_kwargs.enable_thinking` (vLLM, llama.cpp templates) and
  `reasoning_effort` for a level; `reasoning_content` / `reasoning` → `thinking`;
- options a vLLM or llama.cpp server accepts go as extra body fields (`OPTION_MAP`); those
  no OpenAI-compatible server takes per request are dropped (`UNMAPPED`, in the README);
- durations from the router's own timing: `prompt_eval_duration` ≈ time to the first
  token, `eval_duration` ≈ the rest (a whole answer: split by token counts, see `_split`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

# Ollama route kind -> the OpenAI path that does the same job
OPENAI_PATH = {
    "chat": "/v1/chat/completions",
    "generate": "/v1/completions",
    "embed": "/v1/embeddings",
    "embeddings": "/v1/embeddings",
}

# Ollama option -> OpenAI-compatible body field(s): OpenAI's own, then vLLM's and llama.cpp's
# extra sampling fields (each server ignores or accepts the other's names).
OPTION_MAP: dict[str, tuple[str, ...]] = {
    "num_predict": ("max_tokens",),
    "temperature": ("temperature",),
    "top_p": ("top_p",),
    "stop": ("stop",),
    "seed": ("seed",),
    "frequency_penalty": ("frequency_penalty",),
    "presence_penalty": ("presence_penalty",),
    "top_k": ("top_k",),
    "min_p": ("min_p",),
    "typical_p": ("typical_p",),
    "repeat_penalty": ("repetition_penalty", "repeat_penalty"),
    "repeat_last_n": ("repeat_last_n",),
    "tfs_z": ("tfs_z",),
    "mirostat": ("mirostat_mode", "mirostat"),
    "mirostat_tau": ("mirostat_tau",),
    "mirostat_eta": ("mirostat_eta",),
    "num_keep": ("n_keep",),
    "penalize_newline": ("penalize_nl",),
}
# Server-side settings no OpenAI-compatible server takes per request: dropped.
UNMAPPED = (
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "vocab_only",
    "f16_kv",
    "logits_all",
)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def request_to_openai(kind: str, body: dict[str, Any], model: str, stream: bool) -> bytes:
    """The OpenAI request body for an Ollama-API request body."""
    if kind in ("embed", "embeddings"):
        raw = body.get("input", body.get("prompt", ""))
        return json.dumps({"model": model, "input": raw}).encode()
    out: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        out["stream_options"] = {"include_usage": True}
    if kind == "chat":
        out["messages"] = messages_to_openai(body.get("messages") or [])
        if isinstance(body.get("tools"), list) and body["tools"]:
            out["tools"] = body["tools"]
    else:
        prompt = body.get("prompt", "")
        system = body.get("system")
        out["prompt"] = f"{system}\n\n{prompt}" if system else prompt
        if isinstance(body.get("suffix"), str) and body["suffix"]:
            out["suffix"] = body["suffix"]
    options = body.get("options") or {}
    for src, dsts in OPTION_MAP.items():
        value = options.get(src)
        if value is None:
            continue
        if src == "num_predict" and isinstance(value, int) and value < 0:
            continue  # -1 means "no limit" in Ollama
        for dst in dsts:
            out[dst] = value
    think = body.get("think")
    if isinstance(think, bool):
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif think in ("low", "medium", "high"):
        out["chat_template_kwargs"] = {"enable_thinking": True}
        out["reasoning_effort"] = think
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    return json.dumps(out).encode()


def messages_to_openai(messages: Sequence[object]) -> list[object]:
    out: list[object] = []
    pending: list[tuple[str, str]] = []  # (function name, call id) not answered yet
    count = 0
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        role = m.get("role", "user")
        msg: dict[str, Any] = {"role": role, "content": m.get("content", "")}
        images = m.get("images")
        if images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": msg["content"]}]
            parts += [
                {"type": "image_url", "image_url": {"url": f"data:{_mime(img)};base64,{img}"}}
                for img in images
                if isinstance(img, str)
            ]
            msg["content"] = parts
        calls = m.get("tool_calls")
        if role == "assistant" and isinstance(calls, list) and calls:
            msg["tool_calls"] = []
            for tc in calls:
                fn = (tc.get("function") if isinstance(tc, dict) else None) or {}
                call_id = str(tc.get("id") or f"call_{count}")
                count += 1
                args = fn.get("arguments", {})
                arguments = args if isinstance(args, str) else json.dumps(args)
                msg["tool_calls"].append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": fn.get("name", ""), "arguments": arguments},
                    }
                )
                pending.append((str(fn.get("name", "")), call_id))
            msg["content"] = msg["content"] or ""  # a string: llama-cpp-python refuses null here
        elif role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id") or _answered(pending, m.get("tool_name"))
        out.append(msg)
    return out


def _answered(pending: list[tuple[str, str]], name: Any) -> str:
    """The id of the call a tool message answers: the first pending call of that name, or
    the first pending call."""
    for i, (fn, call_id) in enumerate(pending):
        if name is None or fn == name:
            del pending[i]
            return call_id
    return pending.pop(0)[1] if pending else "call_0"


def _mime(b64: str) -> str:
    return {"/9j/": "image/jpeg", "R0lG": "image/gif", "UklG": "image/webp"}.get(b64[:4], "image/png")


def _split(elapsed_ns: int, usage: Any, first_ns: int | None = None) -> dict[str, int]:
    """Ollama's counts and durations. A stream: prompt = time to the first token, eval = the
    rest. A whole answer (no first token seen): the time is split assuming a prompt token
    costs 1/8 of a generated one (prefill is batched), so tokens/s stays meaningful."""
    usage = usage if isinstance(usage, dict) else {}
    p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if first_ns is None:
        first_ns = elapsed_ns * p // (p + 8 * c) if p + c else 0
    first_ns = max(0, min(first_ns, elapsed_ns))
    return {
        "total_duration": elapsed_ns,
        "load_duration": 0,
        "prompt_eval_count": p,
        "prompt_eval_duration": first_ns,
        "eval_count": c,
        "eval_duration": elapsed_ns - first_ns,
    }


def _calls_to_ollama(calls: Any) -> list[dict[str, Any]]:
    out = []
    for i, tc in enumerate(calls if isinstance(calls, list) else []):
        fn = (tc.get("function") if isinstance(tc, dict) else None) or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"_raw": args}  # the model wrote invalid JSON: keep it, as an object
        call: dict[str, Any] = {
            "function": {"index": i, "name": fn.get("name", ""), "arguments": args if isinstance(args, dict) else {}}
        }
        if isinstance(tc, dict) and tc.get("id"):
            call["id"] = tc["id"]
        out.append(call)
    return out


def response_to_ollama(kind: str, data: object, model: str, elapsed_ns: int) -> dict[str, Any]:
    """The Ollama response body for a complete OpenAI response body."""
    if not isinstance(data, dict):
        raise ValueError("backend answered with a non-object body")
    if kind == "embeddings":
        return {"embedding": data["data"][0]["embedding"] if data.get("data") else []}
    if kind == "embed":
        return {
            "model": model,
            "embeddings": [d["embedding"] for d in data.get("data", [])],
            "total_duration": elapsed_ns,
            "load_duration": 0,
            "prompt_eval_count": int((data.get("usage") or {}).get("prompt_tokens") or 0),
        }
    choice = (data.get("choices") or [{}])[0]
    out: dict[str, Any] = {"model": model, "created_at": _now_iso()}
    if kind == "chat":
        msg = choice.get("message") or {}
        out["message"] = {"role": "assistant", "content": msg.get("content") or ""}
        thinking = msg.get("reasoning_content") or msg.get("reasoning")
        if isinstance(thinking, str) and thinking:
            out["message"]["thinking"] = thinking
        if msg.get("tool_calls"):
            out["message"]["tool_calls"] = _calls_to_ollama(msg["tool_calls"])
    else:
        out["response"] = choice.get("text") or ""
    out.update(
        done=True, done_reason=_done_reason(choice.get("finish_reason")), **_split(elapsed_ns, data.get("usage"))
    )
    return out


def _done_reason(finish: object) -> str:
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
        self.finish: object = None  # the last finish_reason sent
        self.usage: object = None  # the last usage sent (an object, when the backend sends one)
        self.done = False
        self.created_at = _now_iso()
        self.first: float | None = None  # when the first token arrived
        self.calls: dict[int, dict[str, str]] = {}  # streamed tool-call pieces by index
        self.pieces = 0  # content chunks: the token count when the backend sends no usage

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
        if not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        thinking = None
        if self.kind == "chat":
            delta = choice.get("delta") or {}
            text = delta.get("content")
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if delta.get("tool_calls"):
                self._collect(delta["tool_calls"])
        else:
            text = choice.get("text")
        if not text and not thinking:
            return None
        if self.first is None:
            self.first = time.perf_counter()
        self.pieces += 1
        chunk: dict[str, Any] = {"model": self.model, "created_at": self.created_at}
        if self.kind == "chat":
            chunk["message"] = {"role": "assistant", "content": text or ""}
            if thinking:
                chunk["message"]["thinking"] = thinking
        else:
            chunk["response"] = text
        chunk["done"] = False
        return json.dumps(chunk).encode() + b"\n"

    def _collect(self, deltas: Any) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        for d in deltas if isinstance(deltas, list) else []:
            if not isinstance(d, dict):
                continue
            slot = self.calls.setdefault(int(d.get("index") or 0), {"id": "", "name": "", "arguments": ""})
            fn = d.get("function") or {}
            slot["id"] = slot["id"] or str(d.get("id") or "")
            slot["name"] += str(fn.get("name") or "")
            slot["arguments"] += str(fn.get("arguments") or "")

    def final(self) -> bytes | None:
        if self.done:
            return None
        self.done = True
        out = b""
        if self.calls:  # one chunk with every call, as Ollama streams them
            calls = _calls_to_ollama(
                [
                    {"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for _, c in sorted(self.calls.items())
                ]
            )
            out = (
                json.dumps(
                    {
                        "model": self.model,
                        "created_at": self.created_at,
                        "message": {"role": "assistant", "content": "", "tool_calls": calls},
                        "done": False,
                    }
                ).encode()
                + b"\n"
            )
        chunk: dict[str, Any] = {"model": self.model, "created_at": _now_iso()}
        if self.kind == "chat":
            chunk["message"] = {"role": "assistant", "content": ""}
        else:
            chunk["response"] = ""
        now = time.perf_counter()
        first = None if self.first is None else int((self.first - self.t0) * 1e9)
        usage = self.usage if isinstance(self.usage, dict) else {"completion_tokens": self.pieces}
        chunk.update(
            done=True, done_reason=_done_reason(self.finish), **_split(int((now - self.t0) * 1e9), usage, first)
        )
        return out + json.dumps(chunk).encode() + b"\n"
