"""Agent sessions: think time between turns, tool output appended each turn, and sessions
replayed from a JSONL trace with per-turn timing.

An agent (a coding assistant, a tool-using app) sends a turn, waits for a tool (seconds),
then sends the whole history plus the tool's output. What that costs is the KV cache kept
or lost between turns, so the history must be the real one (earlier prompts and answers,
in order) and a turn must wait for the previous answer.

`--think-ms MEAN[:DIST[:SHAPE]]`, like the arrival options: `2000` (constant), `2000:poisson`
(exponential, mean 2000 ms), `2000:gamma:0.5` (gamma of shape 0.5, mean 2000 ms: burstier).
`--tool-tokens N`: each turn after the first carries N tokens of new tool output.

A session trace (`--trace FILE.jsonl` whose lines have `turns`): one session per line,
  {"session_id": "s1", "timestamp": 0, "turns": [
     {"input_tokens": 900, "output_tokens": 64},
     {"delay_ms": 2500, "tool_tokens": 300, "output_tokens": 64},
     {"timestamp": 9000, "text": "Now run the tests.", "output_tokens": 32}]}
- the session starts at `timestamp` (ms from the trace's start; or `arrival` in seconds,
  or `arrival_time_ns`);
- a turn goes out when the previous answer has arrived and, after it, its `delay_ms` (think
  or tool time; aiperf's `delay` in ms is read too) has passed, and not before its own
  `timestamp` (ms from the trace's start) if it has one; without either, `--think-ms`;
  `tool_duration_ns` (llmservingsim's agentic traces) is the wait *after* a turn;
- its prompt: the session's history, then `tool_tokens` of tool output (default
  `--tool-tokens`; none on the first turn), then the user text: `text` as given, or filler
  padding the whole prompt to `input_tokens` (`input_length`, `input_toks`), or
  `new_tokens` of new text;
- `output_tokens` (`output_length`, `output_toks`, `max_tokens`) caps the answer;
  `sub_requests` is read as `turns`. Bad lines are refused with file and line.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .workload import filler_text

CHARS_PER_TOKEN = 4


@dataclass
class Think:
    mean_ms: float
    dist: str = "constant"  # constant | poisson | gamma
    shape: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def seconds(self) -> float:
        mean = self.mean_ms / 1000
        if mean <= 0:
            return 0.0
        if self.dist == "poisson":
            return self.rng.expovariate(1 / mean)
        if self.dist == "gamma":
            return self.rng.gammavariate(self.shape, mean / self.shape)
        return mean


def parse_think(text: str) -> Think:
    """`2000`, `2000:poisson`, `2000:gamma:0.5` (an argparse type)."""
    parts = [p.strip() for p in text.split(":")]
    try:
        mean = float(parts[0])
        shape = float(parts[2]) if len(parts) > 2 else 1.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MS[:constant|poisson|gamma[:SHAPE]]") from None
    dist = parts[1] if len(parts) > 1 else "constant"
    if mean < 0 or shape <= 0 or dist not in ("constant", "poisson", "gamma") or len(parts) > 3:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MS >= 0, then constant, poisson or gamma (with a SHAPE > 0), e.g. 2000:gamma:0.5"
        )
    if len(parts) > 2 and dist != "gamma":
        raise argparse.ArgumentTypeError(f"{text!r}: only gamma takes a shape")
    return Think(mean, dist, shape)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent sessions (see loadtest/sessions.py)")
    g.add_argument(
        "--think-ms",
        type=parse_think,
        default=None,
        metavar="MS[:DIST[:SHAPE]]",
        help="think or tool time between a session's turns: 2000, 2000:poisson, 2000:gamma:0.5 (default: none)",
    )
    g.add_argument(
        "--tool-tokens",
        type=int,
        default=0,
        help="tokens of tool output appended to the history before each turn after the first",
    )


def tool_output(tokens: int, key: str, turn: int) -> str:
    """New text no cache holds: the session and turn open it."""
    return filler_text(tokens, f"[tool output {key} turn {turn}] ") if tokens > 0 else ""


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages) // CHARS_PER_TOKEN


@dataclass
class AgentTurn:
    input_tokens: int | None = None
    new_tokens: int | None = None
    text: str | None = None
    output_tokens: int | None = None
    tool_tokens: int | None = None
    delay_s: float | None = None  # after the previous answer
    at_s: float | None = None  # not before this, from the trace's start
    after_s: float = 0.0  # wait after this turn's answer (llmservingsim's tool_duration_ns)


@dataclass
class Session:
    id: str
    start_s: float
    turns: list[AgentTurn]


def _num(d: dict[str, Any], keys: tuple[str, ...], where: str, scale: float = 1.0) -> float | None:
    for k in keys:
        if d.get(k) is not None:
            v = d[k]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{where}: {k} must be a number >= 0, got {v!r}")
            return v * scale
    return None


def _int(d: dict[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    v = _num(d, keys, where)
    return None if v is None else int(v)


def is_session_line(d: dict[str, Any]) -> bool:
    return "turns" in d or "sub_requests" in d


def read_session(n: int, d: dict[str, Any], path: str) -> Session:
    where = f"trace {path}:{n}"
    turns = d.get("turns", d.get("sub_requests"))
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise ValueError(f"{where}: turns must be a non-empty list of objects")
    start = _num(d, ("arrival",), where)
    if start is None:
        start = _num(d, ("timestamp",), where, 1e-3)
    if start is None:
        start = _num(d, ("arrival_time_ns",), where, 1e-9) or 0.0
    out = []
    for k, t in enumerate(turns, 1):
        w = f"{where} turn {k}"
        text = t.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"{w}: text must be a string")
        delay = _num(t, ("delay_ms", "delay"), w, 1e-3)
        out.append(
            AgentTurn(
                input_tokens=_int(t, ("input_tokens", "input_length", "input_toks"), w),
                new_tokens=_int(t, ("new_tokens",), w),
                text=text,
                output_tokens=_int(t, ("output_tokens", "output_length", "output_toks", "max_tokens"), w),
                tool_tokens=_int(t, ("tool_tokens",), w),
                delay_s=delay,
                at_s=_num(t, ("timestamp",), w, 1e-3),
                after_s=_num(t, ("tool_duration_ns",), w, 1e-9) or 0.0,
            )
        )
    sid = d.get("session_id")
    return Session(str(sid) if sid is not None else f"line{n}", float(start), out)


@dataclass
class SessionTrace:
    """Sessions from a trace file; `speed` divides every time in it."""

    path: str
    sessions: list[Session]
    speed: float = 1.0

    @property
    def span(self) -> float:
        return max((s.start_s for s in self.sessions), default=0.0) / self.speed

    @property
    def mean_rate(self) -> float:
        """Sessions per second."""
        return len(self.sessions) / self.span if self.span > 0 else float(len(self.sessions))

    def messages(self, history: list[dict[str, Any]], s: Session, k: int, tool_tokens: int) -> list[dict[str, Any]]:
        t = s.turns[k]
        tool = tool_output(t.tool_tokens if t.tool_tokens is not None else (tool_tokens if k else 0), s.id, k + 1)
        if t.text is not None:
            new = t.text
        elif t.new_tokens is not None:
            new = filler_text(t.new_tokens, f"[{s.id} turn {k + 1}] ")
        else:
            used = prompt_tokens(history) + len(tool) // CHARS_PER_TOKEN
            want = t.input_tokens if t.input_tokens is not None else 32
            new = filler_text(max(want - used, 8), f"[{s.id} turn {k + 1}] ")
        content = f"{tool}\n\n{new}" if tool else new
        return [*history, {"role": "user", "content": content}]


SendTurn = Callable[[str, int, list[dict[str, Any]], int | None, float], Awaitable[Any]]


async def replay(
    trace: SessionTrace,
    think: Think | None,
    tool_tokens: int,
    t0: float,
    may_start: Callable[[float], bool],
    send_turn: SendTurn,
) -> None:
    """Every session from its start time, its turns one after the other. `send_turn(session
    id, turn number, messages, output tokens, intended start)` returns the Result (`ok`,
    `answer`)."""

    async def one(s: Session) -> None:
        await _sleep_until(t0 + s.start_s / trace.speed)
        history: list[dict[str, Any]] = []
        after = 0.0
        for k, t in enumerate(s.turns):
            if k:
                wait = t.delay_s if t.delay_s is not None else (think.seconds() if think and t.at_s is None else 0.0)
                when = time.perf_counter() + (wait + after) / trace.speed
                if t.at_s is not None:
                    when = max(when, t0 + t.at_s / trace.speed)
                await _sleep_until(when)
            start = time.perf_counter()
            if not may_start(start):
                return
            messages = trace.messages(history, s, k, tool_tokens)
            r = await send_turn(s.id, k + 1, messages, t.output_tokens, start)
            if not r.ok:
                return
            history = [*messages, {"role": "assistant", "content": r.answer}]
            after = t.after_s

    await asyncio.gather(*(one(s) for s in trace.sessions), return_exceptions=False)


async def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
