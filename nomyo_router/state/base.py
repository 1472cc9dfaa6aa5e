"""The state store interface the scheduler talks to.

Implementations: `MemoryStore` (one process). A shared store for `--workers N`
and Redis implements the same methods; the contract tests run over each.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from ..domain import Endpoint
from .key_limits import Limiter, Limits, Verdict
from .queue_order import Fair

Choose = Callable[[Sequence[Endpoint]], Endpoint]
# How the routing policy picks for `model` among free endpoints, given their in-flight counts:
# handed to the shared-state host by whoever wires the router, so state never imports routing.
Picker = Callable[[str, Sequence[Endpoint], Callable[[Endpoint], int]], Endpoint]
# What a reindex changed, per model: the names of the endpoints that no longer serve it, and
# the endpoints that serve it now and did not before.
Changes = Mapping[str, tuple[frozenset[str], Sequence[Endpoint]]]


class QueueFull(Exception):
    """Every eligible slot is busy and the wait queue is at `max_queue`."""


class QueueTimeout(Exception):
    """The request waited `timeout` without a slot. `order` is its place in the queue, to
    keep when it waits again (affinity spill)."""

    def __init__(self, model: str, order: int | None = None) -> None:
        super().__init__(model)
        self.order = order


class NoEndpoint(Exception):
    """No healthy endpoint serves the model."""


class Rehome(Exception):
    """The endpoints serving the model changed while the request waited (a config reload, or
    discovery found the model gone from an endpoint or new on one) and the store cannot move
    it itself: the scheduler works out its candidates again and waits again with `order`,
    its place in the queue. `waited`: seconds it waited in the store call it leaves, taken
    off what is left of its timeout. Only the scheduler sees it."""

    def __init__(self, model: str, order: int | None, waited: float) -> None:
        super().__init__(model)
        self.order = order
        self.waited = waited


class Ask(msgspec.Struct, kw_only=True, frozen=True):
    """What one request asks a store for: a slot for `model` on one of `candidates` (all
    serve it). Built once per store call by the scheduler, read by every store; a new field
    goes here, not into five signatures. (A msgspec struct: made in C, about a quarter of the
    cost of a class with slots and a keyword-only constructor.)"""

    model: str
    candidates: Sequence[Endpoint]
    choose: Choose  # picks one free candidate (the routing policy, given to the store)
    timeout: float  # seconds it may wait in the queue for a slot
    order: int | None = None  # its place in the queue, kept from a QueueTimeout when it waits again
    pin: str | None = None  # an affinity key to point at the granted endpoint, with the grant
    fair: Fair | None = None  # the client's share of the queue (queue_order.py): client, priority, weight
    owner: object = None  # whose slot it is, for a store whose slots other processes share


class Lease:
    """One slot on one endpoint. Release it in a `finally`; releasing twice is harmless."""

    __slots__ = ("endpoint", "queued_s", "affinity", "token", "_store", "_released")

    def __init__(self, store: StateStore, endpoint: Endpoint, queued_s: float = 0.0, token: object = None) -> None:
        """`token`: the store's handle on this lease, if it needs one (given back to its `release`)."""
        self.endpoint = endpoint
        self.queued_s = queued_s
        self.affinity: str | None = None  # hit | miss | spill | repin, when affinity applied
        self.token = token
        self._store = store
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._store.release(self.endpoint, self.token)


class StateStore(ABC):
    # Requests of this process waiting outside the store, for a per-client permit
    # (api/client_caps.py): they count toward `max_queue` like the store's own waiters.
    held_aside = 0

    @abstractmethod
    async def acquire(self, ask: Ask) -> Lease:
        """A slot on one of `ask.candidates`: at once on a free one picked by `ask.choose`,
        else the first that frees in FIFO order. `ask.order` (from a QueueTimeout) keeps the
        place of a request that already waited once. `ask.pin`: an affinity key to point at
        the granted endpoint, together with the grant (so the next turn, in any worker,
        finds it). `ask.fair`: the client's share of the queue (queue_order.py): where a request
        that waits is placed. Raises QueueFull, QueueTimeout, NoEndpoint."""

    @abstractmethod
    def release(self, endpoint: Endpoint, token: object = None) -> None: ...

    @abstractmethod
    def in_flight(self, endpoint: Endpoint) -> int:
        """In-flight requests at `endpoint` as this process last knew them."""

    @abstractmethod
    def queue_length(self) -> int: ...

    @abstractmethod
    def record(self, endpoint: str, model: str) -> None:
        """Count one request served (usage counters, summed over every worker and instance)."""

    async def snapshot(self) -> dict[str, Any]:
        """{"in_flight": {endpoint: n}, "queue_length": n, "pins": n, "usage": {endpoint: {model: n}},
        "mode": ...} for /health."""
        return {"mode": type(self).__name__, "in_flight": {}, "queue_length": self.queue_length()}

    @abstractmethod
    def is_healthy(self, endpoint: Endpoint) -> bool: ...

    @abstractmethod
    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        """Marking an endpoint healthy hands its free slots to waiting requests."""

    @abstractmethod
    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        """The first of `keys` (longest prefix first) that has a live pin: (key, endpoint name).
        Finding a pin refreshes its idle timer."""

    @abstractmethod
    async def set_pin(self, key: str, endpoint: str) -> None: ...

    @abstractmethod
    async def drop_pin(self, key: str) -> None: ...

    def publish(self, topic: str, data: object) -> None:
        """Tell every other process sharing this state (best effort, no reply): how the
        routing layer keeps per-process indexes converged. One process: nothing to do."""
        return None

    def subscribe(self, topic: str, callback: Callable[[object], None]) -> None:
        """Call `callback(data)` for what other processes `publish` on `topic`."""
        return None

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Config reload: `endpoints` are the new ones, the resized ones and the removed ones
        (those with 0 slots: they finish what they hold and get nothing more). Hands slots
        that a resize freed to waiting requests."""
        return None

    def rehome(self, changes: Changes) -> None:
        """The scheduler's index changed (a reload, a reindex; never per request). A request
        waiting for a changed model may use the added endpoints from now on and no longer the
        gone ones, keeping its place in the queue; one left with none leaves with `Rehome`,
        to be placed again or answered at once (without this, a request waiting for an
        endpoint that is gone waits out its timeout). A store that cannot change a waiting
        request's endpoints sends back every waiter of those models, oldest first."""
        return None

    # ---- per-key rate limits and budgets (key_limits.py): counted where every process counts ----
    _limiter: Limiter | None = None

    def limiter(self) -> Limiter:
        """This process's own count (the memory store's; the others' while they cannot share)."""
        if self._limiter is None:
            self._limiter = Limiter()
        return self._limiter

    async def admit(self, client: str, limits: Limits, count: bool = True, reserve: int = 0) -> Verdict:
        """Admit one request of `client` under `limits` (counting it and reserving `reserve`
        tokens: the verdict's `hold`), or say which limit refuses it; `count=False` only
        looks. Called only for keys that have limits."""
        return self.limiter().admit(client, limits, time.time(), count, reserve)

    def spend(self, client: str, tokens: int, limits: Limits, hold: int = 0, reserved: int = 0) -> None:
        """An answer of `client` ended having used `tokens`; its reservation (`hold`, of
        `reserved` tokens) is settled to them (sent on without waiting)."""
        self.limiter().spend(client, tokens, limits, time.time(), hold, reserved)

    async def start(self) -> None:
        """Connect or elect, for stores that share state; called once before serving."""
        return None

    async def close(self) -> None:
        return None
