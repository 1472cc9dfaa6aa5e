"""Which failures are retried, and how many retries the router may spend.

Retries happen only before any byte went to the client (after that, a stream is resumed
instead, see `resume`). Every backend-side failure is retried: 429, 500, 502, 503, 504,
connection refused or reset, a timeout or hang, and an error chunk that arrives before any
content. A 4xx other than 429 is the client's own doing and is passed through.

A budget keeps retries from multiplying load in a general outage: over a sliding 10 s
window, retries may be at most `retry_budget` of the requests, plus a floor of 50 (so a quiet
router, and the burst of requests in flight on a backend when it starts failing, can still
retry), like Envoy's and Finagle's retry budgets.
"""

from __future__ import annotations

import time
from collections import deque

RETRY_STATUSES = frozenset((429, 500, 502, 503, 504))
BUSY_STATUSES = frozenset((429, 503))  # the backend is alive but full


def is_error_chunk(chunk: bytes) -> bool:
    """A first stream chunk that is an error, not content (Ollama NDJSON or OpenAI SSE)."""
    head = chunk[:32].lstrip()
    if head.startswith(b"data:"):
        head = head[5:].lstrip()
    return head.startswith(b'{"error"')


class RetryBudget:
    def __init__(self, ratio: float, window: float = 10.0, floor: int = 50) -> None:
        self.ratio = ratio
        self.window = window
        self.floor = floor
        self._requests = 0
        self._retries: deque[float] = deque()
        self._buckets: deque[tuple[float, int]] = deque()  # (second, requests) for the window
        self._second = 0.0
        self._count = 0

    def request(self) -> None:
        """Count one client request (call once per request, not per attempt)."""
        now = time.monotonic()
        sec = now // 1
        if sec != self._second:
            if self._count:
                self._buckets.append((self._second, self._count))
            self._second, self._count = sec, 0
            self._roll(now)
        self._count += 1
        self._requests += 1

    def _roll(self, now: float) -> None:
        cutoff = now - self.window
        while self._buckets and self._buckets[0][0] < cutoff:
            self._requests -= self._buckets.popleft()[1]
        while self._retries and self._retries[0] < cutoff:
            self._retries.popleft()

    def allow(self) -> bool:
        """May one more retry be spent now? Counts it when yes."""
        now = time.monotonic()
        self._roll(now)
        if len(self._retries) >= max(self.floor, self.ratio * self._requests):
            return False
        self._retries.append(now)
        return True
