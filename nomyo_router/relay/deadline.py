"""How long to wait for a backend's first byte before calling it hung.

A fixed timeout is either minutes (so a hung backend holds requests that long) or short
(so a legitimately slow 32k-token prefill is cut). Instead each (endpoint, model) learns
what it has shown, as a recent peak that decays slowly (so one legitimately slow answer keeps
the deadline generous): for streams, time to first byte per KiB of request body (prompt
size); for whole answers, the time to the whole answer. The deadline is
`max(first_byte_floor, first_byte_factor × expected)`, capped by `first_byte_timeout`.
What an endpoint has not shown yet is borrowed from the other endpoints serving the model.
Before anything is known for a model (a cold start), an attempt that can still be retried
elsewhere gets the floor (scaled by prompt size), and the last possible attempt gets
`first_byte_timeout`: a hung backend costs one floor, a legitimately slow first answer is
cut and retried until its last attempt, which may take as long as it needs.

A whole answer's deadline must know how long *this* answer will be, which only the
request can say: `whole` gives one only to a request that bounds its own length
(`max_tokens`, `num_predict`), from the learned time to the first token and the learned time
per generated token (`tokens`: the recent peak, per endpoint and model, of the time after the
first token divided by the tokens generated; for an answer that was not streamed, its whole
time divided by its tokens, which overstates it), `max(floor, factor × (first + length ×
per token))`, and only when that fits under `gap` (stream_idle_timeout). Any other whole
answer is streamed from the backend and assembled by the router (relay/whole_from_stream.py),
judged by its first token and then by the gap between chunks: a long answer is never
mistaken for a hung backend.
"""

from __future__ import annotations

DECAY = 0.98  # per observation: a slow answer seen once keeps the deadline long for a while


class Deadlines:
    def __init__(self, floor: float, factor: float, cap: float) -> None:
        self.floor = floor
        self.factor = factor
        self.cap = cap
        # (endpoint, model, stream) -> seconds (whole) or seconds per KiB (stream)
        self._seen: dict[tuple[str, str, bool], float] = {}
        self._model: dict[tuple[str, bool], float] = {}  # (model, stream) -> the same over endpoints
        self._token: dict[tuple[str, str], float] = {}  # (endpoint, model) -> seconds per generated token
        self._token_model: dict[str, float] = {}  # model -> the same over endpoints

    def deadline(self, endpoint: str, model: str, stream: bool, body_bytes: int, last: bool) -> float:
        learned = self._seen.get((endpoint, model, stream))
        if learned is None:
            learned = self._model.get((model, stream))
        if learned is None:
            return self.cap if last else min(self.cap, self.floor * max(1.0, body_bytes / 65536))
        expected = learned * max(1.0, body_bytes / 1024) if stream else learned
        return min(self.cap, max(self.floor, self.factor * expected))

    def observe(self, endpoint: str, model: str, stream: bool, body_bytes: int, seconds: float) -> None:
        value = seconds / max(1.0, body_bytes / 1024) if stream else seconds
        seen = self._seen.get((endpoint, model, stream))
        self._seen[(endpoint, model, stream)] = value if seen is None else max(value, seen * DECAY)
        peak = self._model.get((model, stream))
        self._model[(model, stream)] = value if peak is None else max(value, peak * DECAY)

    def whole(self, endpoint: str, model: str, body_bytes: int, length: int | None, gap: float) -> float | None:
        """The deadline of a whole answer of at most `length` tokens, or None: stream it instead
        (no bound, nothing learned yet, or more than `gap` seconds needed)."""
        if length is None:
            return None
        per = self._token.get((endpoint, model))
        if per is None:
            per = self._token_model.get(model)
            if per is None:
                return None
        first = self._seen.get((endpoint, model, True))
        if first is None:
            first = self._model.get((model, True), 0.0)
        expected = first * max(1.0, body_bytes / 1024) + length * per
        deadline = max(self.floor, self.factor * expected)
        return deadline if deadline <= gap and deadline <= self.cap else None

    def tokens(self, endpoint: str, model: str, seconds: float, tokens: int) -> None:
        """An answer generated `tokens` tokens in `seconds` after its first one (or in all)."""
        if tokens < 1:
            return
        value = seconds / tokens
        seen = self._token.get((endpoint, model))
        self._token[(endpoint, model)] = value if seen is None else max(value, seen * DECAY)
        peak = self._token_model.get(model)
        self._token_model[model] = value if peak is None else max(value, peak * DECAY)
