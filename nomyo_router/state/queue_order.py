"""Fair queuing with priorities, as a place in the one wait queue.

Every store already hands a freed slot to the waiting request with the lowest order number
(memory.py, the shared-state host, Redis's Lua). Fairness is therefore decided when a
request starts waiting, by the number it gets, where the queue lives (so it is exact under
`--workers N` and across instances):

    order = (PRIORITY_MAX - priority) x PRIORITY_STEP + start

- **Strict priority**: a higher `client_keys[].priority` gives a lower order whatever the
  start, so it is served first.
- **Weighted fair share** among keys of one priority — start-time fair queuing (SFQ), which
  is deficit round robin with a cost of one per request: a key's request starts at
  `max(V, the key's last finish)` and finishes `STEP / weight` later; V is the start of the
  request last handed a slot. A key that floods gets starts V, V+s, V+2s, ...; a key that
  starts or returns to waiting starts at V (the current share, no saved-up credit), so it
  waits behind at most about one request of each other key per slot.
- **FIFO within a key**: its starts only grow.
- **Cancelled requests are not charged**: a request that leaves the queue without a slot
  gives its share back when it was its key's last.

Requests without a key share one default client (""). With no priorities or weights every
key's start is V or its last finish, so a single client's requests keep arrival order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

PRIORITY_MAX = 100  # client_keys[].priority is between -PRIORITY_MAX and PRIORITY_MAX
PRIORITY_STEP = 1 << 45  # orders stay integers below 2^53 (exact as Redis scores)
STEP = 1000  # one request's share at weight 1

Fair = tuple[str, int, int]  # (client, priority, this client's step: STEP / weight)
DEFAULT: Fair = ("", 0, STEP)
# A Batch API line's place, should it ever wait (it takes only a slot free at once; another
# instance may take that slot first): below every key's requests.
BATCH: Fair = ("\x00batch", -PRIORITY_MAX, STEP)


def spec(client: str, priority: int, weight: float) -> Fair:
    return client, priority, max(1, round(STEP / weight))


class Share(Protocol):
    """A client key's place in the queue, as configured (`client_keys[]`)."""

    @property
    def name(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def weight(self) -> float: ...


def specs_of(client_keys: Iterable[Share]) -> dict[str, Fair]:
    """Every client key's share (each key is a client of its own, whatever its weight)."""
    return {c.name: spec(c.name, c.priority, c.weight) for c in client_keys}


def start_of(order: int) -> int:
    return order % PRIORITY_STEP


class FairClock:
    """The virtual time and each key's last finish, for a store that keeps the queue in
    this process (the memory store, the shared-state host)."""

    def __init__(self) -> None:
        self.now = 0  # V: the start of the request last handed a slot
        self.finish: dict[str, int] = {}  # each key's last finish: its next request starts there or later
        self._served: dict[str, int] = {}  # the finish of its last request handed a slot
        self._waiting: dict[str, list[int]] = {}  # the starts of its requests waiting (ascending)

    def order(self, fair: Fair | None) -> tuple[int, str, int, int]:
        """(order, client, start, step) for a request that starts waiting now."""
        client, priority, step = fair or DEFAULT
        start = max(self.now, self.finish.get(client, 0))
        self.finish[client] = start + step
        self._waiting.setdefault(client, []).append(start)
        return (PRIORITY_MAX - priority) * PRIORITY_STEP + start, client, start, step

    def served(self, order: int, share: tuple[str, int, int] | None) -> None:
        """A waiting request was handed a slot: the virtual time moves to its start."""
        start = start_of(order)
        if start > self.now:
            self.now = start
        if share is not None:
            client, start, step = share
            self._forget(client, start)
            self._served[client] = max(self._served.get(client, 0), start + step)

    def left(self, client: str, start: int, step: int) -> None:
        """A request left the queue without a slot: its key is charged only for what it was
        served and what it still has waiting."""
        waiting = self._forget(client, start)
        self.finish[client] = max(self._served.get(client, 0), waiting[-1] + step if waiting else 0)

    def _forget(self, client: str, start: int) -> list[int]:
        waiting = self._waiting.get(client, [])
        if start in waiting:
            waiting.remove(start)
        if not waiting:
            self._waiting.pop(client, None)
        return waiting
