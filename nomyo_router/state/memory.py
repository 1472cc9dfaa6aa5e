"""In-process state: exact for one worker, no locks (one event loop, no await between
checking a slot and taking it)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from ..domain import Endpoint
from .base import Ask, Changes, Lease, NoEndpoint, QueueFull, QueueTimeout, Rehome, StateStore
from .key_limits import BudgetSource
from .queue_order import FairClock


class _Waiter:
    __slots__ = ("seq", "names", "future", "owner", "share")

    def __init__(
        self,
        seq: int,
        names: frozenset[str],
        future: asyncio.Future[Endpoint | None],
        owner: object,
        share: tuple[str, int, int] | None = None,
    ) -> None:
        self.seq, self.names, self.future, self.owner = seq, names, future, owner
        self.share = share  # (client, start, step) when its place was taken here (queue_order.py)


class MemoryStore(StateStore):
    def __init__(
        self, max_queue: int, pin_ttl: float = 600.0, max_pins: int = 100_000, budgets: BudgetSource | None = None
    ) -> None:
        """`budgets`: what the token budgets had spent before this process (the usage database)."""
        self._budgets = budgets
        self.max_queue = max_queue
        self.pin_ttl = pin_ttl
        self.max_pins = max_pins
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()  # key -> (endpoint, expiry)
        self._usage: dict[str, Counter[str]] = {}
        self._in_flight: dict[str, int] = {}
        self._unhealthy: set[str] = set()
        self._queues: dict[str, deque[_Waiter]] = {}  # per model: A never waits behind B
        self._queued = 0
        self._fair = FairClock()  # each waiting request's place: priority, then fair share (queue_order.py)
        self._endpoints: dict[str, Endpoint] = {}

    async def start(self) -> None:
        await self.limiter().seed_from(self._budgets)

    def _free(self, ep: Endpoint) -> bool:
        return ep.name not in self._unhealthy and self._in_flight.get(ep.name, 0) < ep.slots

    def _take(self, ep: Endpoint, owner: object = None) -> bool:
        """Take a slot `_free` said is there (a subclass whose counts other processes share
        re-checks, and may fail). `owner`: whose it is, for such a subclass."""
        self._in_flight[ep.name] = self._in_flight.get(ep.name, 0) + 1
        return True

    async def acquire(self, ask: Ask) -> Lease:
        candidates, owner = ask.candidates, ask.owner
        free = [e for e in candidates if self._free(e)]
        while free:
            ep = free[0] if len(free) == 1 else ask.choose(free)
            if self._take(ep, owner):
                if ask.pin is not None:
                    self._pin(ask.pin, ep.name)
                return Lease(self, ep, token=owner)
            free.remove(ep)
        model, order, pin = ask.model, ask.order, ask.pin  # (waiting: read only now)
        if all(e.name in self._unhealthy for e in candidates):
            raise NoEndpoint(model)
        if self._queued + self.held_aside >= self.max_queue:
            raise QueueFull(model)
        for e in candidates:
            self._endpoints[e.name] = e
        t0 = time.monotonic()
        fut: asyncio.Future[Endpoint | None] = asyncio.get_running_loop().create_future()  # None: see `rehome`
        share = None
        if order is None:  # its place: by priority, then its key's fair share (queue_order.py)
            order, *rest = self._fair.order(ask.fair)
            share = tuple(rest)
        waiter = _Waiter(order, frozenset(e.name for e in candidates), fut, owner, share)  # type: ignore[arg-type]
        queue = self._queues.setdefault(model, deque())
        if queue and queue[-1].seq > waiter.seq:  # a request that already waited keeps its place
            i = len(queue)
            while i > 0 and queue[i - 1].seq > waiter.seq:
                i -= 1
            queue.insert(i, waiter)
        else:
            queue.append(waiter)
        self._queued += 1
        try:
            async with asyncio.timeout(ask.timeout):
                got = await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                handed = fut.result()
                if handed is not None:  # (None: sent back by `rehome`, no slot)
                    self.release(handed, owner)  # handed a slot just as we gave up: pass it on
            else:
                fut.cancel()
                if waiter in queue:
                    queue.remove(waiter)
                    self._queued -= 1
                    if waiter.share is not None:  # left without a slot: its key is not charged
                        self._fair.left(*waiter.share)
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(model, waiter.seq) from None
            raise
        if got is None:  # sent back by `rehome` (no endpoint left): placed again, in the same order
            raise Rehome(model, waiter.seq, time.monotonic() - t0)
        if pin is not None:
            self._pin(pin, got.name)
        return Lease(self, got, time.monotonic() - t0, owner)

    def release(self, endpoint: Endpoint, token: object = None) -> None:
        self._in_flight[endpoint.name] -= 1
        self._dispatch(endpoint)

    def _dispatch(self, ep: Endpoint) -> None:
        """Hand free slots of `ep` to the longest-waiting request that may use it."""
        while self._queued and self._free(ep):
            best: tuple[deque[_Waiter], _Waiter] | None = None
            for queue in self._queues.values():
                for w in queue:
                    if ep.name in w.names and not w.future.done():  # done: cancelled, leaving
                        if best is None or w.seq < best[1].seq:
                            best = (queue, w)
                        break
            if best is None:
                return
            queue, w = best
            if not self._take(ep, w.owner):
                return  # another process took it first
            queue.remove(w)
            self._queued -= 1
            self._fair.served(w.seq, w.share)
            w.future.set_result(ep)

    def record(self, endpoint: str, model: str) -> None:
        usage = self._usage.get(endpoint)
        if usage is None:  # (not setdefault: that built a Counter per request, 0.6 µs)
            usage = self._usage[endpoint] = Counter()
        usage[model] += 1

    async def snapshot(self) -> dict[str, Any]:
        return {
            "mode": "memory",
            "in_flight": dict(self._in_flight),
            "queue_length": self._queued,
            "pins": len(self._pins),
            "usage": {e: dict(c) for e, c in self._usage.items()},
        }

    def in_flight(self, endpoint: Endpoint) -> int:
        return self._in_flight.get(endpoint.name, 0)

    def queue_length(self) -> int:
        return self._queued

    async def find_pin(self, keys: Sequence[str]) -> tuple[str, str] | None:
        now = time.monotonic()
        pins = self._pins
        for key in keys:
            pin = pins.get(key)
            if pin is None:
                continue
            if pin[1] < now:
                del pins[key]
                continue
            pins[key] = (pin[0], now + self.pin_ttl)
            pins.move_to_end(key)
            return key, pin[0]
        return None

    async def set_pin(self, key: str, endpoint: str) -> None:
        self._pin(key, endpoint)

    def _pin(self, key: str, endpoint: str) -> None:
        pins = self._pins
        pins[key] = (endpoint, time.monotonic() + self.pin_ttl)
        pins.move_to_end(key)
        while len(pins) > self.max_pins:
            pins.popitem(last=False)

    async def drop_pin(self, key: str) -> None:
        self._pins.pop(key, None)

    def pin_count(self) -> int:
        return len(self._pins)

    def is_healthy(self, endpoint: Endpoint) -> bool:
        return endpoint.name not in self._unhealthy

    def update_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        for ep in endpoints:
            self._dispatch(ep)

    def rehome(self, changes: Changes) -> None:
        """Change the endpoints of the waiting requests in place, so they keep their place in
        the queue (and, at the host of the shared store, in every worker's order at once):
        the gone ones out, the added ones in (an endpoint the request had excluded, e.g.
        already tried, stays out). One left with none goes back to the scheduler, oldest
        first. Then the added endpoints' free slots go to the oldest that may use them."""
        woken: list[_Waiter] = []
        added: dict[str, Endpoint] = {}
        for model, (gone, new) in changes.items():
            names = frozenset(e.name for e in new)
            added.update((e.name, e) for e in new)
            queue = self._queues.get(model)
            if not queue:
                continue
            stay: list[_Waiter] = []
            for w in queue:
                if not w.future.done():  # (a done one is leaving on its own)
                    w.names = (w.names - gone) | names
                    if not w.names:
                        woken.append(w)
                        continue
                stay.append(w)
            if len(stay) < len(queue):  # in place: a waiter that stays finds itself there
                queue.clear()
                queue.extend(stay)
        self._queued -= len(woken)
        for w in sorted(woken, key=lambda w: w.seq):
            if w.share is not None:  # (it waits again in the same place, uncharged)
                self._fair.left(*w.share)
            w.future.set_result(None)  # (None: see `acquire`)
        for ep in added.values():
            self._dispatch(ep)

    def set_healthy(self, endpoint: Endpoint, healthy: bool) -> None:
        if healthy:
            if endpoint.name in self._unhealthy:
                self._unhealthy.discard(endpoint.name)
                self._dispatch(endpoint)
        else:
            self._unhealthy.add(endpoint.name)
