"""Workloads from files: `--dataset FILE.jsonl` and `--trace FILE.jsonl` replay.

Dataset lines (one JSON object each; requests take them in order, cycling):
  {"prompt": "Why is the sky blue?", "output_tokens": 128}
  {"messages": [{"role": "system", ...}, {"role": "user", ...}], "output_tokens": 64}
`output_tokens` (or `max_tokens`) is optional: it becomes num_predict / max_tokens. A
chat history is sent as is (generate endpoints get its messages joined); with `--turns`
it opens a conversation that then grows.

Trace lines (replayed open loop at their arrival times, `--trace-speed` x faster):
  {"timestamp": 1250, "input_tokens": 900, "output_tokens": 120, "session_id": "s7"}
`timestamp` is in ms from the trace's start (Mooncake's convention) or `arrival` in
seconds; `input_length` / `output_length` are accepted too. Requests of one session form a
conversation: each carries the session's earlier prompts and answers, padded with new text
up to `input_tokens` in all. With `--turns T` every arrival sends T turns back to back.
Mooncake's `hash_ids` (block hashes, `--trace-block-tokens` tokens each) make the prompt
of blocks of text fixed by those ids, so requests sharing leading ids share that prefix
(loadtest/blocks.py). A BurstGPT CSV is read too (loadtest/burstgpt.py).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from . import blocks, burstgpt
from .workload import filler_text

CHARS_PER_TOKEN = 4


def _lines(path: str, what: str) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{what} {path}:{n}: not JSON ({e})") from None
            if not isinstance(d, dict):
                raise ValueError(f"{what} {path}:{n}: expected a JSON object")
            out.append((n, d))
    if not out:
        raise ValueError(f"{what} {path}: no lines")
    return out  # type: ignore[return-value]


def _int(d: dict[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for k in keys:
        if k in d and d[k] is not None:
            v = d[k]
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{where}: {k} must be a whole number >= 0, got {v!r}")
            return v
    return None


@dataclass
class Item:
    messages: list[dict[str, Any]] | None
    prompt: str | None
    output_tokens: int | None

    def as_prompt(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n\n".join(str(m.get("content", "")) for m in self.messages or [])

    def as_messages(self) -> list[dict[str, Any]]:
        return (
            [dict(m) for m in self.messages]
            if self.messages is not None
            else [{"role": "user", "content": self.prompt}]
        )


class Dataset:
    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[Item] = []
        for n, d in _lines(path, "dataset"):
            where = f"dataset {path}:{n}"
            msgs, prompt = d.get("messages"), d.get("prompt")
            if msgs is None and not isinstance(prompt, str):
                raise ValueError(f'{where}: needs "prompt" (a string) or "messages" (a chat history)')
            if msgs is not None and not (
                isinstance(msgs, list)
                and msgs
                and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in msgs)
            ):
                raise ValueError(f'{where}: "messages" must be a non-empty list of {{role, content}}')
            self.items.append(Item(msgs, prompt, _int(d, ("output_tokens", "max_tokens"), where)))

    def item(self, i: int) -> Item:
        return self.items[i % len(self.items)]

    def body(self, spec: Any, i: int) -> bytes:
        it = self.item(i)
        if spec.endpoint == "chat":
            return spec.body(it.as_messages(), max_tokens=it.output_tokens)
        return spec.body(prompt=it.as_prompt(), max_tokens=it.output_tokens)


@dataclass
class Entry:
    at: float  # seconds from the trace's start
    input_tokens: int
    output_tokens: int | None
    session: str | None
    hash_ids: list[int] | None = None  # Mooncake's block hashes: the prompt's shared prefix


@dataclass
class Trace:
    path: str
    speed: float = 1.0
    block_tokens: int = 512  # tokens per Mooncake hash id
    entries: list[Entry] = field(default_factory=list)
    histories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError("--trace-speed must be > 0")
        if self.block_tokens < 1:
            raise ValueError("--trace-block-tokens must be >= 1")
        if burstgpt.is_burstgpt(self.path):
            self.entries = burstgpt.read(self.path, lambda at, req, resp: Entry(at, req, resp, None))
        else:
            self._read_jsonl()
        self.entries.sort(key=lambda e: e.at)
        t0 = self.entries[0].at
        for e in self.entries:
            e.at -= t0

    def _read_jsonl(self) -> None:
        for n, d in _lines(self.path, "trace"):
            where = f"trace {self.path}:{n}"
            if "arrival" in d:
                at = d["arrival"]
            elif "timestamp" in d:
                at = d["timestamp"] / 1000 if isinstance(d["timestamp"], (int, float)) else None
            else:
                raise ValueError(f'{where}: needs "timestamp" (ms) or "arrival" (s)')
            if not isinstance(at, (int, float)) or at < 0:
                raise ValueError(f"{where}: the arrival time must be a number >= 0")
            tokens = _int(d, ("input_tokens", "input_length"), where)
            session = d.get("session_id")
            ids = d.get("hash_ids")
            if ids is not None and not (
                isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            ):
                raise ValueError(f"{where}: hash_ids must be a list of whole numbers")
            self.entries.append(
                Entry(
                    float(at),
                    tokens if tokens is not None else 32,
                    _int(d, ("output_tokens", "output_length"), where),
                    str(session) if session is not None else None,
                    ids,
                )
            )

    @property
    def span(self) -> float:
        return self.entries[-1].at / self.speed

    @property
    def mean_rate(self) -> float:
        return len(self.entries) / self.span if self.span > 0 else float(len(self.entries))

    def messages(self, e: Entry, key: str) -> list[dict[str, Any]]:
        """The session's history so far plus a new user message, about `input_tokens` in all."""
        history = self.histories.get(key, [])
        if e.hash_ids is not None and not history:  # Mooncake: the blocks' text, exactly input_tokens
            text = blocks.prompt_from_blocks(e.hash_ids, e.input_tokens, self.block_tokens, key)
            return [{"role": "user", "content": text}]
        used = sum(len(str(m["content"])) for m in history) // CHARS_PER_TOKEN
        text = filler_text(max(e.input_tokens - used, 8), f"[{key}] ")
        return [*history, {"role": "user", "content": text}]

    def record(self, key: str, messages: list[dict[str, Any]], answer: str) -> None:
        self.histories[key] = [*messages, {"role": "assistant", "content": answer}]

    def body(self, spec: Any, e: Entry, messages: list[dict[str, Any]]) -> bytes:
        if spec.endpoint == "chat":
            return spec.body(messages, max_tokens=e.output_tokens)
        return spec.body(prompt="\n\n".join(str(m["content"]) for m in messages), max_tokens=e.output_tokens)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workloads from files (see loadtest/dataset.py for the line formats)")
    g.add_argument(
        "--dataset",
        default=None,
        metavar="FILE.jsonl",
        help="prompts or chat histories (optional output_tokens), taken in order (default: --prompt)",
    )
    g.add_argument(
        "--trace",
        default=None,
        metavar="FILE",
        help="replay arrivals (timestamp ms or arrival s), input/output tokens, session ids and "
        "Mooncake hash_ids (JSONL), or a BurstGPT CSV, open loop, as one stage (default: off)",
    )
    g.add_argument("--trace-speed", type=float, default=1.0, help="replay the trace this many times faster")
    g.add_argument(
        "--trace-block-tokens",
        type=int,
        default=512,
        help="tokens per Mooncake hash id: requests sharing leading ids share that many tokens of prompt per id",
    )


def _trace(args: argparse.Namespace) -> Any:
    """A session trace (lines with `turns`, loadtest/sessions.py) or a request trace."""
    from . import sessions

    if not burstgpt.is_burstgpt(args.trace):
        lines = _lines(args.trace, "trace")
        if sessions.is_session_line(lines[0][1]):  # type: ignore[index]
            if args.trace_speed <= 0:
                raise ValueError("--trace-speed must be > 0")
            if args.turns > 1:
                raise ValueError(f"{args.trace} is a session trace: its lines give the turns; leave out --turns")
            read = [sessions.read_session(n, d, args.trace) for n, d in lines]  # type: ignore[misc]
            return sessions.SessionTrace(args.trace, read, args.trace_speed)
    return Trace(args.trace, args.trace_speed, args.trace_block_tokens)


def load(args: argparse.Namespace) -> tuple[Dataset | None, Any]:
    """The --dataset and --trace of the command line; ValueError with file:line on bad input."""
    if args.dataset and args.trace:
        raise ValueError("--dataset and --trace are two workloads; give one")
    if args.trace and (args.rate is not None or args.ramp):
        raise ValueError("--trace sets the arrivals itself; leave out --rate and --ramp")
    try:
        return (
            Dataset(args.dataset) if args.dataset else None,
            _trace(args) if args.trace else None,
        )
    except OSError as e:
        raise ValueError(f"{e.filename}: {e.strerror}") from None
