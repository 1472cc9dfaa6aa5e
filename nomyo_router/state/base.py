"""The state store interface the scheduler talks to.

Implementations: `MemoryStore` (one process). A shared store for `--workers N`
and Redis implements the same methods; the contract tests run over each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

from ..domain import Endpoint

Choose = Callable[[Sequence[Endpoint]], Endpoint]


class QueueFull(Exception):
    """Every eligible slot is busy and the wait queue is at `max_queue`."""


class QueueTimeout(Exception):
    """The request waited `queue_timeout` without a slot."""


class NoEndpoint(Exception):
    """No healthy endpoint serves the model."""


class Lease:
    """One slot on one endpoint. Release it in a `finally`; releasing twice is harmless."""

    __slots__ = ("endpoint", "queued_s", "affinity", "_store", "_released")

    def __init__(self, store: "StateStore", endpoint: Endpoint, queued_s: float = 0.0) -> None:
        self.endpoint = endpoint
        self.queued_s = queued_s
        self.affinity: str | None = None  # hit | miss | spill | repin, when affinity applied
        self._store = store
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._store.release(self.endpoint)


class StateStore(ABC):
    @abstractmethod
    async def acquire(self, model: str, candidates: Sequence[Endpoint], choose: Choose,
                      timeout: float, order: int | None = None) -> Lease:
        """A slot on one of `candidates` (all serve `model`): at once on a free one picked by
        `choose`, else the first that frees in FIFO order. `order` (from `next_order`) keeps
        the place of a request that already waited once. Raises QueueFull, QueueTimeout,
        NoEndpoint."""

    @abstractmethod
    def next_order(self) -> int:
        """A queue position for a request that may wait more than once."""

    @abstractmethod
    def release(self, endpoint: Endpoint) -> None: ...

    @abstractmethod
    def in_flight(self, endpoint: Endpoint) -> int: ...

    @abstractmethod
    def queue_length(self) -> int: ...

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

    async def close(self) -> None:
        return None
