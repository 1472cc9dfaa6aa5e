"""In-process state: exact for one worker, no locks (one event loop, no await between
checking a slot and taking it)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import Sequence

from ..domain import Endpoint
from .base import Choose, Lease, NoEndpoint, QueueFull, QueueTimeout, StateStore


class _Waiter:
    __slots__ = ("seq", "names", "future")

    def __init__(self, seq: int, names: frozenset[str], future: asyncio.Future) -> None:
        self.seq, self.names, self.future = seq, names, future


class MemoryStore(StateStore):
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._in_flight: dict[str, int] = {}
        self._unhealthy: set[str] = set()
        self._queues: dict[str, deque[_Waiter]] = {}  # per model: A never waits behind B
        self._queued = 0
        self._seq = itertools.count()
        self._endpoints: dict[str, Endpoint] = {}

    def _free(self, ep: Endpoint) -> bool:
        return ep.name not in self._unhealthy and self._in_flight.get(ep.name, 0) < ep.slots

    def _take(self, ep: Endpoint) -> None:
        self._in_flight[ep.name] = self._in_flight.get(ep.name, 0) + 1

    async def acquire(self, model: str, candidates: Sequence[Endpoint], choose: Choose,
                      timeout: float) -> Lease:
        free = [e for e in candidates if self._free(e)]
        if free:
            ep = free[0] if len(free) == 1 else choose(free)
            self._take(ep)
            return Lease(self, ep)
        if all(e.name in self._unhealthy for e in candidates):
            raise NoEndpoint(model)
        if self._queued >= self.max_queue:
            raise QueueFull(model)
        for e in candidates:
            self._endpoints[e.name] = e
        t0 = time.monotonic()
        fut: asyncio.Future[Endpoint] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(next(self._seq), frozenset(e.name for e in candidates), fut)
        queue = self._queues.setdefault(model, deque())
        queue.append(waiter)
        self._queued += 1
        try:
            async with asyncio.timeout(timeout):
                ep = await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())  # handed a slot just as we gave up: pass it on
            else:
                fut.cancel()
                queue.remove(waiter)
                self._queued -= 1
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(model) from None
            raise
        return Lease(self, ep, time.monotonic() - t0)

    def release(self, endpoint: Endpoint) -> None:
        self._in_flight[endpoint.name] -= 1
        self._dispatch(endpoint)

    def _dispatch(self, ep: Endpoint) -> None:
        """Hand free slots of `ep` to the longest-waiting request that may use it."""
        while self._queued and self._free(ep):
            best: tuple[deque[_Waiter], _Waiter] | None = None
            for queue in self._queues.values():
                for w in queue:
                    if ep.name in w.names:
                        if best is None or w.seq < best[1].seq:
                            best = (queue, w)
                        break
            if best is None:
                return
            queue, w = best
            queue.remove(w)
            self._queued -= 1
            self._take(ep)
            w.future.set_result(ep)

    def in_flight(self, endpoint: Endpoint) -> int:
        return self._in_flight.get(endpoint.name, 0)

    def queue_length(self) -> int:
        return self._queued

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        if healthy:
            if endpoint.name in self._unhealthy:
                self._unhealthy.discard(endpoint.name)
                self._dispatch(endpoint)
        else:
            self._unhealthy.add(endpoint.name)
