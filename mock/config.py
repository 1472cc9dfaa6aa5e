"""The mock's knobs: one dataclass, shared by the CLI, `/mock/config` and tests."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

JITTER_DISTS = ("none", "normal", "uniform", "exponential")


@dataclass
class MockConfig:
    models: list[str] = field(default_factory=lambda: ["llama3", "qwen2.5:7b"])
    ttft_ms: float = 300.0
    tokens: int = 200
    tok_ms: float = 25.0
    jitter: float = 0.0  # relative spread applied to ttft and tok_ms
    jitter_dist: str = "normal"
    parallel: int = 4
    max_queue: int = 512
    batch_slowdown: float = 0.0  # per-token delay *= 1 + batch_slowdown * (active - 1)
    prefill_ms_per_1k_tokens: float = 0.0
    kv_cache_tokens: int = 131072
    kv_block_tokens: int = 64
    embed_dim: int = 64
    fail_rate: float = 0.0
    busy_rate: float = 0.0
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    error_rate: float = 0.0  # answers that fail under a 200 (a crashed model runner): see HELP
    wedge_rate: float = 0.0  # answers that stop mid-generation and never go on (a wedged backend)
    first_byte_delay_ms: float = 0.0
    list_delay_ms: float = 0.0  # delay before its model lists (/api/tags, /api/ps, /v1/models)
    seed: int = 0
    openai_busy_status: int = 503
    stream_tick_ms: float = 0.0  # > 0: streams written by one shared timer per tick (mock.ticker)
    kv_events: str = ""  # bind a vLLM-style KV-event ZMQ publisher here (tcp://127.0.0.1:PORT)
    context_length: int = 8192  # the context window it reports (/api/show, /api/ps, /v1/models)
    # Ollama's prompt_eval_count: the prompt tokens it evaluated, i.e. not found in its KV cache
    # (what a real Ollama reports); off: the whole prompt
    eval_count_uncached: bool = False

    def validate(self) -> None:
        for name in ("fail_rate", "busy_rate", "drop_rate", "hang_rate", "error_rate", "wedge_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {v!r}")
        for name in (
            "ttft_ms",
            "tok_ms",
            "jitter",
            "batch_slowdown",
            "prefill_ms_per_1k_tokens",
            "first_byte_delay_ms",
            "list_delay_ms",
            "stream_tick_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.parallel < 1:
            raise ValueError("parallel must be >= 1")
        if self.max_queue < 0 or self.tokens < 0 or self.kv_cache_tokens < 0:
            raise ValueError("max_queue, tokens and kv_cache_tokens must be >= 0")
        if self.context_length < 1:
            raise ValueError("context_length must be >= 1")
        if self.kv_block_tokens < 1 or self.embed_dim < 1:
            raise ValueError("kv_block_tokens and embed_dim must be >= 1")
        if self.jitter_dist not in JITTER_DISTS:
            raise ValueError(f"jitter_dist must be one of {JITTER_DISTS}")
        if self.kv_events and not self.kv_events.startswith(("tcp://", "ipc://")):
            raise ValueError("kv_events must be a ZMQ address such as tcp://127.0.0.1:5557")
        if self.openai_busy_status not in (429, 503):
            raise ValueError("openai_busy_status must be 429 or 503")
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError("models must be a non-empty list of names")

    def updated(self, changes: dict[str, Any]) -> MockConfig:
        """A copy with `changes` applied; unknown keys and bad types raise ValueError."""
        known = {f.name: f for f in dataclasses.fields(self)}
        values = dataclasses.asdict(self)
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown knob {key!r}; known: {', '.join(sorted(known))}")
            current = values[key]
            if key == "models" and isinstance(value, str):
                value = [m.strip() for m in value.split(",") if m.strip()]
            elif isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not type(current):
                raise ValueError(f"{key} must be {type(current).__name__}, got {value!r}")
            values[key] = value
        new = MockConfig(**values)
        new.validate()
        return new


HELP = {
    "models": "advertised models; others get 404",
    "ttft_ms": "time to first token in ms (before prefill)",
    "tokens": "tokens per answer (capped by num_predict / max_tokens)",
    "tok_ms": "ms per token after the first",
    "jitter": "relative spread on TTFT and tok-ms",
    "jitter_dist": "distribution of the jitter",
    "parallel": "slots, like OLLAMA_NUM_PARALLEL; the rest wait FIFO",
    "max_queue": "waiting requests; beyond: Ollama's real 503",
    "openai_busy_status": "status on OpenAI routes when the queue is full (429 or 503)",
    "batch_slowdown": "per-token delay x (1 + s x (active - 1))",
    "prefill_ms_per_1k_tokens": "prefill cost of prompt tokens not in this instance's KV cache",
    "kv_cache_tokens": "simulated prefix cache size in tokens (LRU)",
    "kv_block_tokens": "tokens per cache block",
    "embed_dim": "embedding size",
    "fail_rate": "share of requests answered 500",
    "busy_rate": "share of requests answered 503 (busy)",
    "drop_rate": "share of requests whose connection is cut (streams mid-way)",
    "hang_rate": "share of requests accepted and never answered",
    "error_rate": "share of requests that fail under a 200, as when Ollama's model runner crashes: "
    "a stream gets an error record mid-way (then its end; OpenAI: then [DONE], as vLLM), "
    "a whole answer is an error object",
    "wedge_rate": "share of requests that go silent mid-generation and stay so, the connection open, "
    "as a wedged backend: a stream stops after half its tokens, a whole answer never comes",
    "first_byte_delay_ms": "delay before the response headers",
    "list_delay_ms": "delay before the model lists (/api/tags, /api/ps, /v1/models): a backend slow to discover",
    "seed": "seed of the fault dice and jitter",
    "stream_tick_ms": "> 0: one shared timer per tick writes every open stream's due chunk "
    "(tokens delivered <= one tick late; TTFT exact); 0: one sleep per token",
    "context_length": "the context window in tokens it reports: /api/show (num_ctx, model_info), "
    "/api/ps, /v1/models (max_model_len, as vLLM)",
    "kv_events": "publish vLLM-style KV-cache events on this ZMQ address (e.g. tcp://127.0.0.1:5557); empty: off",
    "eval_count_uncached": "Ollama's prompt_eval_count counts only the prompt tokens not in its KV cache, "
    "as a real Ollama's does (off: the whole prompt)",
}


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "", defaults: MockConfig | None = None) -> None:
    """Add one flag per knob (`--ttft-ms`, ...); `prefix` gives `--mock-ttft-ms` for the load tester."""
    defaults = defaults or MockConfig()
    for f in dataclasses.fields(MockConfig):
        flag = "--" + prefix + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        dest = prefix.replace("-", "_") + f.name
        what = HELP.get(f.name, f.name.replace("_", " "))
        if f.name == "models":
            parser.add_argument(
                flag, dest=dest, default=",".join(default), help=f"{what}, comma-separated (default: %(default)s)"
            )
        elif isinstance(default, bool):
            parser.add_argument(
                flag,
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{what} (default: %(default)s)",
            )
        elif f.name == "jitter_dist":
            parser.add_argument(
                flag, dest=dest, default=default, choices=JITTER_DISTS, help=f"{what} (default: %(default)s)"
            )
        else:
            parser.add_argument(
                flag, dest=dest, type=type(default), default=default, help=f"{what} (default: %(default)s)"
            )


def from_namespace(ns: argparse.Namespace, prefix: str = "") -> MockConfig:
    p = prefix.replace("-", "_")
    values = {f.name: getattr(ns, p + f.name) for f in dataclasses.fields(MockConfig)}
    values["models"] = [m.strip() for m in values["models"].split(",") if m.strip()]
    cfg = MockConfig(**values)
    cfg.validate()
    return cfg
