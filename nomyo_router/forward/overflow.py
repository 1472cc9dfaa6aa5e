"""Trim-and-retry on context overflow (`context_overflow: trim`): a chat whose history no
longer fits the model's context is answered from its most recent part instead of failing.

When a backend refuses a chat request because it overflows the context, the router drops the
oldest turns — never a system message, never the last user turn and what follows it — and
asks again (admitted like any request: slot, queue, fairness), until the backend accepts or
nothing more can be dropped; the answer says how many messages went in `X-Router-Trimmed`.

An overflow is recognised by its text, wherever it sits in the body, so every server's form
is found: OpenAI's 400 `context_length_exceeded`, vLLM's "maximum context length is N tokens"
(also in its older `{"object": "error", "message": ...}` body), llama.cpp's "exceeds the
available context size" (`exceed_context_size_error`), Ollama's "exceeds the context length".
Only 400 and 413 answers are held to be read; any other answer, and a 400 that is not an
overflow, passes through untouched.

How much to drop: when the error says how many tokens were asked and how many fit (vLLM,
OpenAI, llama.cpp do), the oldest turns whose share of the messages' text covers the excess
(and a tenth more) go at once; otherwise half of the droppable turns go each time. A turn is a
user message with the answers and tool results that follow it, so no tool result loses the
call it answers.

Bounded like failover: a request is asked at most `max_attempts` times in all (the last time
with every droppable turn gone, so it is answered whenever its system messages and last turn
fit), each re-ask is a retry of the router's retry budget, and each counts one request against
the client key's rpm and token budgets (429 past them). So one request makes at most
`max_attempts` trimmed asks, each subject to failover as any request is.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..api.requests import GenRequest
from ..events import Events
from ..relay.exchange import Exchange, Handle
from ..relay.retry import RetryBudget
from ..server.asgi import Send
from .extra_calls import Charge

HEADER = b"x-router-trimmed"
HELD_STATUSES = frozenset((400, 413))
HOLD_BYTES = 64 * 1024  # an error body longer than this is not an overflow message: relayed as it comes
KEPT_ROLES = frozenset(("system", "developer"))
_OVERFLOW = re.compile(
    rb"context_length_exceeded|exceed_context_size|model_context_window_exceeded|maximum context length"
    rb"|context length is|maximum prompt length|greater than the context length|reduce the length of the messages"
    rb"|exceeds? (?:the )?(?:available |maximum |model'?s? )?context(?: length| size| window)"
    rb"|(?:input|prompt) (?:length )?(?:is too long|exceeds)|prompt too long|too large for model with",
    re.I,
)
_LIMIT = re.compile(rb"(?:context length is|\"n_ctx\"\s*:|context size \()\s*(\d+)", re.I)
_USED = re.compile(rb"(?:requested|resulted in|\"n_prompt_tokens\"\s*:|request \()\s*(\d+)", re.I)


def is_overflow(body: bytes) -> bool:
    return _OVERFLOW.search(body) is not None


class OverflowWatch:
    """`send` for one attempt: a 400 or 413 answer is held until its end to be read; anything
    else goes out as it comes, with `X-Router-Trimmed` when messages were dropped."""

    __slots__ = ("_send", "dropped", "start", "body", "holding", "overflow")

    def __init__(self, send: Send, dropped: int) -> None:
        self._send, self.dropped = send, dropped
        self.start: dict[str, Any] | None = None
        self.body: list[bytes] = []
        self.holding = False
        self.overflow = False

    async def send(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            if self.dropped:
                msg = {**msg, "headers": [*msg.get("headers", ()), (HEADER, b"%d" % self.dropped)]}
            if msg["status"] in HELD_STATUSES:
                self.start, self.holding = msg, True
                return
        elif self.holding:
            self.body.append(msg.get("body", b""))
            more = msg.get("more_body", False)
            size = sum(map(len, self.body))
            if not more and size <= HOLD_BYTES and is_overflow(b"".join(self.body)):
                self.overflow = True  # kept back: the request is asked again, shorter
                return
            if more and size <= HOLD_BYTES:
                return
            await self.release(more)
            return
        await self._send(msg)

    async def release(self, more: bool = False) -> None:
        """Send what was held (a 400 that is not an overflow, or the last overflow)."""
        if self.start is None:
            return
        start, self.start, self.holding = self.start, None, False
        await self._send(start)
        body, self.body = b"".join(self.body), []
        await self._send({"type": "http.response.body", "body": body, "more_body": more})


async def serve(handle: Handle, events: Events, bounds: Bounds, req: GenRequest, ex: Exchange) -> None:
    messages = req.body.get("messages")
    if req.kind != "chat" or not isinstance(messages, list):
        return await handle(req, ex)
    send = ex.send  # every answer passes a `OverflowWatch` of it, to be read when it is an error
    dropped = asks = 0
    while True:
        hold = OverflowWatch(send, dropped)
        await handle(req, ex.via(hold.send))
        asks += 1
        if not hold.overflow:
            return
        last = asks + 1 >= bounds.max_asks  # the last ask allowed: every droppable turn goes
        fewer = trim(req.body["messages"], b"".join(hold.body), everything=last)
        if fewer is None or asks >= bounds.max_asks or not bounds.budget.allow():
            hold.overflow = False  # nothing more to drop, or no more asks: the refusal stands
            await hold.release()
            return
        await bounds.charge(req.client)  # (429 past the key's rpm or budgets: raised, nothing sent yet)
        dropped += len(req.body["messages"]) - len(fewer)
        req.body["messages"] = fewer
        req.raw = json.dumps(req.body).encode()
        ex.again()
        events.count("context_trim", ex.rec.endpoint or "", req.key)


def trim(messages: list[object], error: bytes, everything: bool = False) -> list[object] | None:
    """`messages` without their oldest turns (see the module's doc; `everything`: all that may
    go), or None when no turn can be dropped."""
    last_user = max(
        (i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=len(messages)
    )
    turns: list[list[int]] = []  # indexes of droppable messages, grouped by turn
    for i, m in enumerate(messages[:last_user]):
        role = m.get("role") if isinstance(m, dict) else None
        if role in KEPT_ROLES:
            continue
        if role == "user" or not turns:
            turns.append([])
        turns[-1].append(i)
    if not turns:
        return None
    count = len(turns) if everything else _turns_to_drop(messages, turns, error)
    gone = {i for turn in turns[:count] for i in turn}
    return [m for i, m in enumerate(messages) if i not in gone]


def _turns_to_drop(messages: list[object], turns: list[list[int]], error: bytes) -> int:
    limit, used = _LIMIT.search(error), _USED.search(error)
    if limit and used and int(used.group(1)) > int(limit.group(1)):
        share = (int(used.group(1)) - int(limit.group(1))) * 1.1 / int(used.group(1))  # of the text to go
        sizes = [len(json.dumps(m)) for m in messages]
        need, total, count = share * sum(sizes), 0.0, 0
        while count < len(turns) and total < need:
            total += sum(sizes[i] for i in turns[count])
            count += 1
        return max(count, 1)
    return max((len(turns) + 1) // 2, 1)


class Bounds:
    """What limits a request's re-asks: `max_asks` in all (the config's `max_attempts`), the
    proxy's retry budget, and `charge(client)`, which counts one more request on the client
    key's rpm and budgets (raising its 429 past them)."""

    __slots__ = ("max_asks", "budget", "charge")

    def __init__(self, max_asks: int, budget: RetryBudget, charge: Charge) -> None:
        self.max_asks, self.budget, self.charge = max_asks, budget, charge


def wrap(handle: Handle, events: Events, bounds: Bounds) -> Handle:
    async def trimming(req: GenRequest, ex: Exchange) -> None:
        await serve(handle, events, bounds, req, ex)

    return trimming
