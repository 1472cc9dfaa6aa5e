"""Per-key rate limits and token budgets, counted exactly in one place.

A key's `rpm` admits at most that many requests in any rolling 60 s: the times of the
requests it admitted in the last minute are kept, and a request is admitted while fewer than
`rpm` are. Its `tpm` admits a request while the tokens of the last 60 s are below the limit;
`tokens_per_day` likewise with the tokens of the calendar day (UTC). Tokens are counted in two
steps. An admitted request *reserves* what it may spend (api/key_admission.py says how much):
its reservation counts against both budgets while it runs, so requests arriving together
cannot all pass a budget that only their sum exceeds. When it ends, the reservation is
*settled*: replaced by the tokens it really used (a request that used fewer gives the rest
back), spent at that moment. A request is admitted while spent plus reserved is below the
limit, so a budget is passed by at most the last admitted request's reservation. A refused
request is not counted, and reserves nothing.

A reservation lasts until its request ends, at most `HOLD_S` (then it no longer counts; its
tokens are still spent when the request ends): a process killed with SIGKILL cannot hold a
key's budget for longer.

`Limiter` is the in-memory count: the memory store's, and with `--workers N` the shared-state
host's (every worker asks it, so the count is one). Redis keeps the same count in Lua
(redis_limits.py). Only keys that have limits are counted at all. What a restart would lose
is read back from the usage database when the count starts (`Seed`, ops/usage/budgets.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

log = logging.getLogger("nomyo_router.limits")

WINDOW_S = 60.0
DAY_S = 86400
HOLD_S = 600.0  # the longest a reservation counts
RESERVED_WAIT_S = 1.0  # Retry-After when only requests in progress hold the budget


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
    tokens spent in the last 60 s; `day_tokens`: tokens spent today (UTC); `reset_requests`
    and `reset_tokens`: seconds until the oldest request, the oldest spend leaves the window;
    `held`: tokens reserved by the key's requests in progress (an admitted one's included);
    `hold`: the admitted request's reservation (0: none), to settle when it ends."""

    refused: str | None
    retry_after: float
    requests: int
    tokens: int
    day_tokens: int
    reset_requests: float
    reset_tokens: float
    held: int = 0
    hold: int = 0

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
            int(_number(v[7])),
            int(_number(v[8])),
        )


def _number(v: str | float | None) -> str | float:
    if v is None:
        raise TypeError("a verdict's numbers are never null")
    return v


class Seed(NamedTuple):
    """What was spent before this count started (a restart, a new shared-state host), as the
    usage database has it: `day` (days since the epoch, UTC), each key's tokens of that day,
    and the spends of the last minute as (key, time, tokens)."""

    day: int
    day_tokens: dict[str, int]
    recent: list[tuple[str, float, int]]


BudgetSource = Callable[[], Seed]  # reads a Seed (given to the stores by the wiring)


class _Use:
    __slots__ = ("requests", "spends", "minute", "day", "day_tokens", "holds", "held")

    def __init__(self) -> None:
        self.requests: deque[float] = deque()  # times of admitted requests in the window
        self.spends: deque[tuple[float, int]] = deque()  # (time, tokens) in the window
        self.minute = 0  # the sum of `spends`
        self.day = 0
        self.day_tokens = 0
        self.holds: OrderedDict[int, tuple[float, int]] = OrderedDict()  # reservation -> (time, tokens), oldest first
        self.held = 0  # the sum of `holds`


class Limiter:
    def __init__(self) -> None:
        self._use: dict[str, _Use] = {}
        # (reservation numbers of a new count start at random: a request reserved at an earlier
        # shared-state host settles here by number, and must not take another's)
        self._holds = random.randrange(1, 1 << 40)

    def _current(self, client: str, now: float) -> _Use:
        use = self._use.get(client)
        if use is None:
            use = self._use[client] = _Use()
        edge = now - WINDOW_S
        while use.requests and use.requests[0] <= edge:
            use.requests.popleft()
        while use.spends and use.spends[0][0] <= edge:
            use.minute -= use.spends.popleft()[1]
        holds = use.holds
        while holds:
            hold, (t, n) = next(iter(holds.items()))
            if t > now - HOLD_S:
                break
            del holds[hold]
            use.held -= n
        day = int(now // DAY_S)
        if use.day != day:
            use.day, use.day_tokens = day, 0
        return use

    def admit(self, client: str, limits: Limits, now: float, count: bool = True, reserve: int = 0) -> Verdict:
        """Admit one request of `client` (and count it, reserving `reserve` tokens when the key
        has a token budget) or say which limit refuses it. `count=False`: only look (the
        dashboard and /metrics)."""
        use = self._current(client, now)
        refused, wait, held = None, 0.0, use.held
        if limits.tokens_per_day is not None and use.day_tokens + held >= limits.tokens_per_day:
            refused = "tokens_per_day"
            wait = (use.day + 1) * DAY_S - now if use.day_tokens >= limits.tokens_per_day else RESERVED_WAIT_S
        if limits.rpm is not None and len(use.requests) >= limits.rpm:
            refused = refused or "rpm"
            wait = max(wait, use.requests[len(use.requests) - limits.rpm] + WINDOW_S - now)
        if limits.tpm is not None and use.minute + held >= limits.tpm:
            refused = refused or "tpm"
            left, waited = use.minute + held, RESERVED_WAIT_S
            for t, n in use.spends:  # the time enough of the oldest spends have left the window
                left -= n
                if left < limits.tpm:
                    waited = t + WINDOW_S - now
                    break
            wait = max(wait, waited)
        hold = 0
        if refused is None and count:
            if limits.rpm is not None:
                use.requests.append(now)
            if reserve > 0 and (limits.tpm is not None or limits.tokens_per_day is not None):
                self._holds += 1
                hold = self._holds
                use.holds[hold] = (now, reserve)
                use.held += reserve
        return Verdict(
            refused,
            max(wait, 0.0),
            len(use.requests),
            use.minute,
            use.day_tokens,
            use.requests[0] + WINDOW_S - now if use.requests else 0.0,
            use.spends[0][0] + WINDOW_S - now if use.spends else 0.0,
            use.held,
            hold,
        )

    def spend(self, client: str, tokens: int, limits: Limits, now: float, hold: int = 0, reserved: int = 0) -> None:
        """An answer of `client` ended having used `tokens`: its reservation (`hold` of
        `reserved` tokens, if it made one here) is settled to them. A reservation this count
        does not know (made at an earlier host, or expired) is passed over."""
        use = self._current(client, now)
        if hold and use.holds.get(hold, (0.0, -1))[1] == reserved:
            del use.holds[hold]
            use.held -= reserved
        if tokens <= 0:
            return
        if limits.tpm is not None:
            use.spends.append((now, tokens))
            use.minute += tokens
        if limits.tokens_per_day is not None:
            use.day_tokens += tokens

    def release(self, client: str, hold: int) -> None:
        """A reservation whose request will never settle it (its worker is gone) is dropped."""
        use = self._use.get(client)
        if use is not None:
            _, n = use.holds.pop(hold, (0.0, 0))
            use.held -= n

    async def seed_from(self, source: BudgetSource | None) -> None:
        """Start from what `source` (the usage database) says was spent, before any request
        is counted (read on a thread). A database that cannot be read is logged, and the count
        starts at zero."""
        if source is None:
            return
        try:
            seed = await asyncio.to_thread(source)
        except Exception as e:  # (the usage store reports the file itself when it opens it)
            log.warning("token budgets: could not read what was spent before (%s); counting from zero", e)
            return
        self.seed(seed, time.time())

    def seed(self, seed: Seed, now: float) -> None:
        """Start from `seed` (before any request is counted)."""
        edge = now - WINDOW_S
        for client, t, n in sorted(seed.recent, key=lambda r: r[1]):
            if t > edge and n > 0:
                use = self._current(client, now)
                use.spends.append((t, n))
                use.minute += n
        if int(now // DAY_S) == seed.day:
            for client, n in seed.day_tokens.items():
                self._current(client, now).day_tokens += max(n, 0)

    def forget(self, keep: set[str]) -> None:
        """A reload removed keys: their counts go."""
        for client in [c for c in self._use if c not in keep]:
            del self._use[client]
