"""Per-key rate limits and token budgets, counted exactly in one place.

A key's `rpm` admits at most that many requests in any rolling 60 s: the times of the
requests it admitted in the last minute are kept, and a request is admitted while fewer than
`rpm` are. Its `tpm` admits a request while the tokens its answers used in the last 60 s
(prompt + completion as the backends reported them, counted when each answer ended) are below
the limit: the spends of the last minute are kept with their times. `tokens_per_day` counts
the tokens of the calendar day (UTC). A refused request is not counted.

`Limiter` is the in-memory count: the memory store's, and with `--workers N` the shared-state
host's (every worker asks it, so the count is one). Redis keeps the same count in Lua
(redis_limits.py). Only keys that have limits are counted at all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

WINDOW_S = 60.0
DAY_S = 86400


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's limits; None: no such limit."""

    rpm: int | None = None
    tpm: int | None = None
    tokens_per_day: int | None = None

    def wire(self) -> list[int]:
        """[rpm, tpm, tokens_per_day] with 0 for none: how they travel to the host and Redis."""
        return [self.rpm or 0, self.tpm or 0, self.tokens_per_day or 0]

    @classmethod
    def from_wire(cls, v: list[int]) -> Limits:
        return cls(v[0] or None, v[1] or None, v[2] or None)


class Verdict(NamedTuple):
    """What the count says of a key now. `refused`: None when admitted, else the limit that
    refused it ("rpm", "tpm" or "tokens_per_day"); `retry_after`: seconds until it would be
    admitted; `requests`: requests in the last 60 s (an admitted one included); `tokens`:
    tokens in the last 60 s; `day_tokens`: tokens today (UTC); `reset_requests` and
    `reset_tokens`: seconds until the oldest request, the oldest spend leaves the window."""

    refused: str | None
    retry_after: float
    requests: int
    tokens: int
    day_tokens: int
    reset_requests: float
    reset_tokens: float

    def wire(self) -> list[str | float | None]:
        """Its fields in order: how it travels from the host and Redis (which answer strings)."""
        return list(self)

    @classmethod
    def from_wire(cls, v: Sequence[str | float | None]) -> Verdict:
        refused = v[0]
        return cls(
            str(refused) if refused else None,
            float(_number(v[1])),
            int(_number(v[2])),
            int(_number(v[3])),
            int(_number(v[4])),
            float(_number(v[5])),
            float(_number(v[6])),
        )


def _number(v: str | float | None) -> str | float:
    if v is None:
        raise TypeError("a verdict's numbers are never null")
    return v


class _Use:
    __slots__ = ("requests", "spends", "minute", "day", "day_tokens")

    def __init__(self) -> None:
        self.requests: deque[float] = deque()  # times of admitted requests in the window
        self.spends: deque[tuple[float, int]] = deque()  # (time, tokens) in the window
        self.minute = 0  # the sum of `spends`
        self.day = 0
        self.day_tokens = 0


class Limiter:
    def __init__(self) -> None:
        self._use: dict[str, _Use] = {}

    def _current(self, client: str, now: float) -> _Use:
        use = self._use.get(client)
        if use is None:
            use = self._use[client] = _Use()
        edge = now - WINDOW_S
        while use.requests and use.requests[0] <= edge:
            use.requests.popleft()
        while use.spends and use.spends[0][0] <= edge:
            use.minute -= use.spends.popleft()[1]
        day = int(now // DAY_S)
        if use.day != day:
            use.day, use.day_tokens = day, 0
        return use

    def admit(self, client: str, limits: Limits, now: float, count: bool = True) -> Verdict:
        """Admit one request of `client` (and count it) or say which limit refuses it.
        `count=False`: only look (the dashboard and /metrics)."""
        use = self._current(client, now)
        refused, wait = None, 0.0
        if limits.tokens_per_day is not None and use.day_tokens >= limits.tokens_per_day:
            refused, wait = "tokens_per_day", (use.day + 1) * DAY_S - now
        if limits.rpm is not None and len(use.requests) >= limits.rpm:
            refused = refused or "rpm"
            wait = max(wait, use.requests[len(use.requests) - limits.rpm] + WINDOW_S - now)
        if limits.tpm is not None and use.minute >= limits.tpm:
            refused = refused or "tpm"
            left = use.minute
            for t, n in use.spends:  # the time enough of the oldest spends have left the window
                left -= n
                if left < limits.tpm:
                    wait = max(wait, t + WINDOW_S - now)
                    break
        if refused is None and count and limits.rpm is not None:
            use.requests.append(now)
        return Verdict(
            refused,
            max(wait, 0.0),
            len(use.requests),
            use.minute,
            use.day_tokens,
            use.requests[0] + WINDOW_S - now if use.requests else 0.0,
            use.spends[0][0] + WINDOW_S - now if use.spends else 0.0,
        )

    def spend(self, client: str, tokens: int, limits: Limits, now: float) -> None:
        """An answer of `client` ended having used `tokens`."""
        use = self._current(client, now)
        if limits.tpm is not None:
            use.spends.append((now, tokens))
            use.minute += tokens
        if limits.tokens_per_day is not None:
            use.day_tokens += tokens

    def forget(self, keep: set[str]) -> None:
        """A reload removed keys: their counts go."""
        for client in [c for c in self._use if c not in keep]:
            del self._use[client]
