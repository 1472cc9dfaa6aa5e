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
