"""What the load tester sends: request payloads, built before the clock starts.

A single-turn workload reuses one pre-encoded body. A conversation (`turns > 1`) grows
its history each turn: it appends the answer and a new user message, as chat clients do.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

FILLER = (
    "the quick brown fox jumps over the lazy dog while the router keeps the cache warm "
    "and every backend serves its share of the load "
)

PATHS = {
    ("ollama", "chat"): "/api/chat",
    ("ollama", "generate"): "/api/generate",
    ("ollama", "embed"): "/api/embed",
    ("openai", "chat"): "/v1/chat/completions",
    ("openai", "generate"): "/v1/completions",
    ("openai", "embed"): "/v1/embeddings",
}


def filler_text(tokens: int, seed: str = "") -> str:
    """About `tokens` tokens (4 characters each) of text, starting with `seed`."""
    chars = max(tokens, 0) * 4
    text = seed
    while len(text) < chars:
        text += FILLER
    return text[:chars] if chars >= len(seed) else seed


@dataclass
class WorkloadSpec:
    api: str = "ollama"
    endpoint: str = "chat"
    stream: bool = True
    model: str = "llama3"
    prompt: str = "Why is the sky blue?"
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    turns: int = 1
    context_tokens: int = 0  # history in a conversation's first turn
    system_prompt: str = "You are a helpful assistant."
    session_header: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # Ollama "options" / OpenAI top-level fields
    prefixes: Any = None  # loadtest.prefix.Prefixes: shared system prompts across users
    dataset: Any = None  # loadtest.dataset.Dataset: prompts or chat histories from a file
    trace: Any = None  # loadtest.dataset.Trace or sessions.SessionTrace: arrivals, sizes and sessions
    think: Any = None  # loadtest.sessions.Think: the wait between a conversation's turns
    tool_tokens: int = 0  # tool output appended before each turn after the first

    @property
    def conversational(self) -> bool:
        """Bodies differ per request (a growing chat, or a shared prefix picked per chat)."""
        return self.turns > 1 or self.prefixes is not None

    @property
    def path(self) -> str:
        return PATHS[(self.api, self.endpoint)]

    def user_text(self) -> str:
        if self.prompt_tokens:
            return filler_text(self.prompt_tokens)
        return self.prompt

    def body(
        self, messages: list[dict[str, Any]] | None = None, prompt: str | None = None, max_tokens: int | None = None
    ) -> bytes:
        b: dict[str, Any] = {"model": self.model}
        if self.endpoint == "embed":
            b["input"] = prompt if prompt is not None else self.user_text()
            return json.dumps(b).encode()
        b["stream"] = self.stream
        if self.endpoint == "chat":
            b["messages"] = messages if messages is not None else [{"role": "user", "content": self.user_text()}]
        else:
            b["prompt"] = prompt if prompt is not None else self.user_text()
        if self.options and self.endpoint != "embed":
            if self.api == "ollama":
                b["options"] = dict(self.options)
            else:
                b.update(self.options)
        limit = max_tokens if max_tokens is not None else self.max_tokens
        if limit is not None:
            if self.api == "ollama":
                b.setdefault("options", {})["num_predict"] = limit
            else:
                b["max_tokens"] = limit
        if self.api == "openai" and self.stream:
            b["stream_options"] = {"include_usage": True}
        return json.dumps(b).encode()


class Conversation:
    """One virtual user's multi-turn chat. `next_body()` then `record(answer)` per turn."""

    def __init__(self, spec: WorkloadSpec, user: int, number: int, item: Any = None) -> None:
        self.spec = spec
        self.id = f"u{user}-c{number}-{uuid.uuid4().hex[:8]}"
        self.turn = 0
        self.max_tokens = None
        if item is not None:  # a dataset line opens the conversation
            self.messages = item.as_messages()
            self.prompt = item.as_prompt()
            self.max_tokens = item.output_tokens
            return
        opening = (
            filler_text(spec.context_tokens, f"[{self.id}] ")
            if spec.context_tokens
            else f"[{self.id}] {spec.user_text()}"
        )
        self.messages: list[dict[str, Any]] = []
        system = spec.prefixes.pick() if spec.prefixes is not None else spec.system_prompt
        if system:
            self.messages.append({"role": "system", "content": system})
        self.messages.append({"role": "user", "content": opening})
        # for generate: the growing prompt (after the shared prefix, when there is one)
        self.prompt = f"{system}\n\n{opening}" if spec.prefixes is not None else opening

    @property
    def finished(self) -> bool:
        return self.turn >= self.spec.turns

    def next_body(self) -> bytes:
        if self.spec.endpoint == "chat":
            return self.spec.body(self.messages, max_tokens=self.max_tokens)
        return self.spec.body(prompt=self.prompt, max_tokens=self.max_tokens)

    def headers(self) -> dict[str, str]:
        if self.spec.session_header:
            return {**self.spec.headers, self.spec.session_header: self.id}
        return self.spec.headers

    @property
    def prompt_tokens(self) -> int:
        """The next turn's prompt as the load tester counts it (4 characters a token)."""
        if self.spec.endpoint == "chat":
            return sum(len(str(m.get("content", ""))) for m in self.messages) // 4
        return len(self.prompt) // 4

    def record(self, answer: str) -> None:
        self.turn += 1
        follow_up = f"Turn {self.turn + 1}: please go on."
        if self.spec.tool_tokens > 0:  # an agent: the tool's output, new text no cache holds
            tool = filler_text(self.spec.tool_tokens, f"[tool output {self.id} turn {self.turn + 1}] ")
            follow_up = f"{tool}\n\n{follow_up}"
        self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "user", "content": follow_up})
        self.prompt = f"{self.prompt}{answer}\n{follow_up}"
