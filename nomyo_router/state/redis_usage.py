"""Requests served per (endpoint, model), counted in Redis in batches, each batch once.

`record` only counts in memory; the store's sweep sends what accumulated in one script call.
A batch whose reply is lost (a stalled Redis may still run it later) is sent again with the
same number, and the USAGE script skips a number it has already counted, so an outage
neither loses counts nor counts them twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .redis_link import RedisLink


class UsageBatches:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._new: Counter[tuple[str, str]] = Counter()
        self._unsent: tuple[int, Counter[tuple[str, str]]] | None = None  # sent, not answered
        self._number = 0

    def record(self, endpoint: str, model: str) -> None:
        self._new[(endpoint, model)] += 1

    async def flush(self, link: RedisLink) -> None:
        """The unanswered batch again as it was, else a new one of what accumulated."""
        if self._unsent is None:
            if not self._new:
                return
            self._number += 1
            self._unsent, self._new = (self._number, self._new), Counter()
        number, batch = self._unsent
        args: list[Any] = [self.owner, number]
        for (ep, model), n in batch.items():
            args += [ep, model, n]
        await link.run("USAGE", *args)
        self._unsent = None

    def pending(self) -> Counter[tuple[str, str]]:
        """Counted here, not yet in Redis (for /health)."""
        out = Counter(self._new)
        if self._unsent is not None:
            out.update(self._unsent[1])
        return out
