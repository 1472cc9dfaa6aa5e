"""Response bodies in the exact shapes Ollama and OpenAI-compatible servers send."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generation import Generation

OLLAMA_VERSION = "0.12.6"


@dataclass
class Timing:
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tok_s: float
    cached_tokens: int = 0  # prompt tokens found in its KV prefix cache
    eval_uncached: bool = False  # Ollama's prompt_eval_count without them, as a real Ollama counts

    def ollama(self) -> dict[str, int]:
        prompt_ns = int(self.ttft_s * 1e9)
        eval_ns = int(self.tok_s * self.output_tokens * 1e9)
        return {
            "total_duration": prompt_ns + eval_ns,
            "load_duration": 0,
            "prompt_eval_count": self.prompt_tokens - self.cached_tokens if self.eval_uncached else self.prompt_tokens,
            "prompt_eval_duration": prompt_ns,
            "eval_count": self.output_tokens,
            "eval_duration": eval_ns,
        }

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage, with the prompt tokens its KV cache held (as OpenAI and vLLM report them)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


_iso_cache: list = [0, ""]


def now_iso() -> str:
    """Ollama's created_at; cached per millisecond because it is on every response."""
    t = time.time()
    ms = int(t * 1000)
    if _iso_cache[0] != ms:
        _iso_cache[0] = ms
        _iso_cache[1] = datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
    return _iso_cache[1]


def stream_content_type(api: str) -> str:
    return "application/x-ndjson" if api == "ollama" else "text/event-stream"


def complete_body(gen: Generation, tokens: list[str], done_reason: str, timing: Timing, rid: str) -> dict[str, Any]:
    text = "".join(tokens)
    if gen.api == "ollama":
        body: dict[str, Any] = {"model": gen.model, "created_at": now_iso()}
        if gen.kind == "chat":
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body.update(done=True, done_reason=done_reason, **timing.ollama())
        return body
    if gen.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": done_reason,
        }
        obj = "chat.completion"
        prefix = "chatcmpl-"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": done_reason}
        obj = "text_completion"
        prefix = "cmpl-"
    return {
        "id": prefix + rid,
        "object": obj,
        "created": int(time.time()),
        "model": gen.model,
        "choices": [choice],
        "usage": timing.usage(),
    }


def embedding_body(gen: Generation, vectors: list[list[float]], prompt_tokens: int) -> dict[str, Any]:
    if gen.api == "openai":
        return {
            "object": "list",
            "model": gen.model,
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    if gen.kind == "embeddings":  # the legacy single-prompt route
        return {"embedding": vectors[0] if vectors else []}
    return {
        "model": gen.model,
        "embeddings": vectors,
        "total_duration": 0,
        "load_duration": 0,
        "prompt_eval_count": prompt_tokens,
    }


class Chunker:
    """Encodes stream chunks. Token chunks come from a template: they are the hot path."""

    def __init__(self, gen: Generation, rid: str) -> None:
        self.gen = gen
        self.created = int(time.time())
        model = json.dumps(gen.model)
        if gen.api == "ollama":
            field = '"message":{"role":"assistant","content":%s}' if gen.kind == "chat" else '"response":%s'
            self._token = '{"model":' + model + ',"created_at":"' + now_iso() + '",' + field + ',"done":false}\n'
            self.id = ""
        elif gen.kind == "chat":
            self.id = "chatcmpl-" + rid
            self._token = (
                'data: {"id":"'
                + self.id
                + '","object":"chat.completion.chunk","created":'
                + str(self.created)
                + ',"model":'
                + model
                + ',"choices":[{"index":0,"delta":{"content":%s},"logprobs":null,'
                '"finish_reason":null}]}\n\n'
            )
        else:
            self.id = "cmpl-" + rid
            self._token = (
                'data: {"id":"'
                + self.id
                + '","object":"text_completion","created":'
                + str(self.created)
                + ',"model":'
                + model
                + ',"choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":null}]}\n\n'
            )

    def token(self, tok: str) -> bytes:
        return (self._token % json.dumps(tok)).encode()

    def head(self) -> bytes:
        """OpenAI chat streams open with a role-only chunk (no content)."""
        if self.gen.api == "openai" and self.gen.kind == "chat":
            return self._sse(
                {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                }
            )
        return b""

    def tail(self, done_reason: str, timing: Timing) -> bytes:
        gen = self.gen
        if gen.api == "ollama":
            body: dict[str, Any] = {"model": gen.model, "created_at": now_iso()}
            if gen.kind == "chat":
                body["message"] = {"role": "assistant", "content": ""}
            else:
                body["response"] = ""
            body.update(done=True, done_reason=done_reason, **timing.ollama())
            return json.dumps(body).encode() + b"\n"
        if gen.kind == "chat":
            finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": done_reason}
        else:
            finish = {"index": 0, "text": "", "logprobs": None, "finish_reason": done_reason}
        out = self._sse({"choices": [finish]})
        if gen.include_usage:
            out += self._sse({"choices": [], "usage": timing.usage()})
        return out + b"data: [DONE]\n\n"

    def _sse(self, fields: dict[str, Any]) -> bytes:
        obj = "chat.completion.chunk" if self.gen.kind == "chat" else "text_completion"
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.gen.model, **fields}
        return b"data: " + json.dumps(body).encode() + b"\n\n"


def _digest(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()


def _details(model: str) -> dict[str, Any]:
    family = model.split(":")[0].split("/")[-1]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": "8.0B",
        "quantization_level": "Q4_K_M",
    }


def ollama_model_entry(model: str) -> dict[str, Any]:
    name = model if ":" in model else model + ":latest"
    return {
        "name": name,
        "model": name,
        "modified_at": now_iso(),
        "size": 4_920_000_000,
        "digest": _digest(name),
        "details": _details(model),
    }


def ollama_ps_entry(model: str, context_length: int = 8192) -> dict[str, Any]:
    name = model if ":" in model else model + ":latest"
    expires = (datetime.now(UTC) + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    return {
        "name": name,
        "model": name,
        "size": 5_500_000_000,
        "digest": _digest(name),
        "details": _details(model),
        "expires_at": expires,
        "size_vram": 5_500_000_000,
        "context_length": context_length,
    }


def ollama_show(model: str, context_length: int = 8192) -> dict[str, Any]:
    return {
        "modelfile": f"FROM {model}\n",
        "parameters": f"num_ctx {context_length}",
        "template": "{{ .Prompt }}",
        "details": _details(model),
        "model_info": {"general.architecture": "llama", "llama.context_length": context_length},
        "capabilities": ["completion", "embedding"],
        "modified_at": now_iso(),
    }
