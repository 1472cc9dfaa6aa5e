"""The bytes of request bodies held by requests that wait for a slot, bounded per process.

A generation request's body is read before the request queues (it names the model, which
says which endpoints and which queue), so without a bound the queue holds up to
`max_queue` × `max_body_bytes` (16 GiB at the defaults). Every body is charged here from
the moment it is read (its declared `Content-Length` is reserved before the first byte is
read) until its request holds a slot or ends; past `max_queued_body_bytes` the request is
refused at once with 503 `queue_full` and `Retry-After`, before its body is read when it
declares its length. Requests holding a slot are bounded by the slots themselves.

Trade-off: the budget is per process (under `--workers N` each worker has its own, as each
has its own memory), and it is one for all models: while one model's queue holds the budget,
a request for another model that has a free slot is refused too (it would have read its body
into a process already holding that much).
"""

from __future__ import annotations


class OverBudget(Exception):
    """The body would take the queued bytes past the budget."""


class BodyBudget:
    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes of bodies read, or being read, by requests without a slot

    def take(self, n: int) -> None:
        """Charge `n` bytes (OverBudget beyond the limit: nothing charged)."""
        if self.held + n > self.limit:
            raise OverBudget
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n
