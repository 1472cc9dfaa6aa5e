"""Streaming on a shared clock (`stream_tick_ms` > 0), for thousands of slow streams.

The default path sleeps once per token per stream: at 2,000 streams × 25 tok/s that is
50,000 task wake-ups a second, and the mock spends its core on its own scheduling. Here one
timer per tick writes the due chunk of every open stream: a stream's token deadlines are the
same as on the default path (first token at TTFT, then one every tok_ms, × batch slowdown),
each rounded *up* to the next tick, so no token is early and none drifts (deadlines
accumulate exactly; only delivery is quantised to ≤ one tick late). The first token is not
quantised: it has its own timer, so TTFT is as exact as on the default path. The bytes are
the default path's, chunk for chunk.

Used for plain streams only (no tools, no `n` > 1, no drop fault); the rest keep the
default path.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from .http import StreamResponse


class _Stream:
    __slots__ = ("resp", "encode", "tokens", "i", "deadline", "tok_s", "tail", "done")

    def __init__(
        self,
        resp: StreamResponse,
        encode: Callable[[str], bytes],
        tokens: list[str],
        deadline: float,
        tok_s: float,
        tail: Callable[[], bytes],
        done: asyncio.Future,
    ) -> None:
        self.resp, self.encode, self.tokens, self.i = resp, encode, tokens, 0
        self.deadline, self.tok_s, self.tail, self.done = deadline, tok_s, tail, done


class Ticker:
    """One per backend: a wheel of streams keyed by the tick of their next deadline."""

    def __init__(self, tick_s: float, slowdown: Callable[[], float]) -> None:
        self.tick = tick_s
        self.slowdown = slowdown  # the batch slowdown factor now
        self._wheel: dict[int, list[_Stream]] = {}
        self._next = 0  # the first tick not processed yet
        self._timer: asyncio.TimerHandle | None = None
        self._armed = 0  # the tick the timer is set for

    async def stream(
        self,
        resp: StreamResponse,
        encode: Callable[[str], bytes],
        tokens: list[str],
        first_at: float,
        tok_s: float,
        tail: Callable[[], bytes],
    ) -> None:
        """Write `tokens` (then `tail` and the end) to `resp`: the first at `first_at`, then one
        every `tok_s` × slowdown; returns when the stream ended."""
        loop = asyncio.get_running_loop()
        s = _Stream(resp, encode, tokens, first_at, tok_s, tail, loop.create_future())
        handle = loop.call_at(first_at, self._step, s)
        try:
            await s.done
        finally:
            handle.cancel()
            s.resp = None  # type: ignore[assignment]  # a cancelled stream is skipped by the wheel

    def _step(self, s: _Stream) -> None:
        """Write the stream's next chunk if it may be written now, then file it for its next one."""
        resp = s.resp
        if resp is None or s.done.done():
            return
        if not resp.writable():
            if resp.gone():
                s.done.set_exception(ConnectionResetError("client went away"))
                return
            self._file(s, self._next)  # paused by back-pressure: try again next tick
            return
        if s.i < len(s.tokens):
            resp.write_nowait(s.encode(s.tokens[s.i]))
            s.i += 1
            s.deadline += s.tok_s * self.slowdown()
            self._file(s, math.ceil(s.deadline / self.tick))
            return
        resp.write_nowait(s.tail())
        resp.write_eof_nowait()
        s.done.set_result(None)

    def _file(self, s: _Stream, tick: int) -> None:
        if tick < self._next:
            tick = self._next
        bucket = self._wheel.get(tick)
        if bucket is None:
            self._wheel[tick] = [s]
        else:
            bucket.append(s)
        if self._timer is None or tick < self._armed:
            self._arm(tick)

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = tick
        self._timer = asyncio.get_running_loop().call_at(tick * self.tick, self._fire)

    def _fire(self) -> None:
        now = math.floor(asyncio.get_running_loop().time() / self.tick + 1e-6)
        wheel = self._wheel
        due = [t for t in wheel if t <= now]
        due.sort()
        self._next = now + 1
        self._timer = None
        for t in due:
            for s in wheel.pop(t):
                self._step(s)
        if wheel and self._timer is None:
            self._arm(max(min(wheel), self._next))
